"""The data-path section of the benchmark (issue 15): ratios to the plain disk, the daemon's
CPU per GiB by thread, the issue's targets, and a projection of what the serial part allows
on bigger machines (labelled as such: arithmetic on the CPU figures, not a measurement)."""
from __future__ import annotations

import statistics
from typing import Any

from .compactreport import target_lines
from .datapath import GIB, READS, WRITES

PROJECT_CORES = (2, 8, 32, 128)
DESCRIBE = {
    "save-torch": "torch.save + fsync vs the safe pattern",
    "save-safetensors": "save_file + fsync, both sides",
    "write-dd": "dd bs=4M conv=fsync",
    "write-cp": "cp + fsync",
    "read-cat": "cat, cold",
    "read-torch": "torch.load, cold",
    "read-safetensors": "load_file, cold",
    "read-safe-open": "safe_open + every get_tensor, cold",
    "small-files": "create + 4 KiB write + close",
}


def _med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def summarize(dp: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per workload: median seconds per side, the ratio of the medians of pairs (cowfs/disk
    time for saves, disk/cowfs time, i.e. throughput ratio, for writes and reads), MB/s, and
    the daemon's CPU seconds per GiB (trio thread, the rest, all)."""
    out: dict[str, dict[str, Any]] = {}
    for name, w in dp["workloads"].items():
        if not w["cowfs_s"] or not w["disk_s"]:
            continue
        pairs = list(zip(w["cowfs_s"], w["disk_s"]))
        gib = w["bytes"] / GIB
        time_ratio = [c / d for c, d in pairs]
        s: dict[str, Any] = {
            "cowfs_s": _med(w["cowfs_s"]), "disk_s": _med(w["disk_s"]),
            "time_ratio": _med(time_ratio), "time_ratio_range": (min(time_ratio), max(time_ratio)),
            "speed_ratio": _med([d / c for c, d in pairs]),
            "speed_ratio_range": (min(d / c for c, d in pairs), max(d / c for c, d in pairs)),
            "cowfs_MBps": w["bytes"] / 1e6 / _med(w["cowfs_s"]), "disk_MBps": w["bytes"] / 1e6 / _med(w["disk_s"]),
            "trio_s_per_gib": _med(w["trio_cpu_s"]) / gib, "daemon_s_per_gib": _med(w["daemon_cpu_s"]) / gib,
            "pairs": len(pairs),
        }
        s["workers_s_per_gib"] = s["daemon_s_per_gib"] - s["trio_s_per_gib"]
        if name == "small-files":
            n = dp["small_files"]
            s["cowfs_per_s"], s["disk_per_s"] = n / s["cowfs_s"], n / s["disk_s"]
        out[name] = s
    return out


def projection(s: dict[str, Any], cores: int) -> float:
    """GB/s the daemon's CPU allows with `cores` cores: the trio thread's part is serial, the
    rest assumed to spread over every core (an upper bound, not a measurement)."""
    trio, total = s["trio_s_per_gib"], s["daemon_s_per_gib"]
    bounds = [GIB / 1e9 / trio] if trio > 0 else []
    if total > 0:
        bounds.append(cores * GIB / 1e9 / total)
    return min(bounds) if bounds else float("inf")


def targets(summ: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    t: list[dict[str, Any]] = []

    def add(name: str, met: bool, detail: str) -> None:
        t.append({"target": f"issue 15: {name}", "met": met, "detail": detail})

    for w, label in (("save-torch", "durable torch.save <= 1.0x the safe pattern"),
                     ("save-safetensors", "save_file + fsync <= 1.0x the disk")):
        if w in summ:
            s = summ[w]
            add(label, s["time_ratio"] <= 1.0, f"{s['time_ratio']:.2f}x [{s['time_ratio_range'][0]:.2f}-"
                f"{s['time_ratio_range'][1]:.2f}] over {s['pairs']} pairs ({s['cowfs_s']:.2f} s vs {s['disk_s']:.2f} s)")
    for w in ("write-dd", "write-cp", *READS):
        if w in summ:
            s = summ[w]
            add(f"{DESCRIBE[w]} >= 0.8x the disk", s["speed_ratio"] >= 0.8,
                f"{s['speed_ratio']:.2f}x [{s['speed_ratio_range'][0]:.2f}-{s['speed_ratio_range'][1]:.2f}] over "
                f"{s['pairs']} pairs ({s['cowfs_MBps']:.0f} vs {s['disk_MBps']:.0f} MB/s)")
    wr = [summ[w] for w in WRITES if w in summ]
    rd = [summ[w] for w in READS if w in summ]
    if wr:
        worst = max(s["trio_s_per_gib"] for s in wr)
        add("trio thread <= 0.25 CPU s per GiB written", worst <= 0.25, f"worst write workload {worst:.2f} s/GiB")
        worst_all = max(s["daemon_s_per_gib"] for s in wr)
        add("whole daemon <= 1.5 CPU s per GiB written", worst_all <= 1.5, f"worst write workload {worst_all:.2f} s/GiB")
    if rd:
        worst = max(s["trio_s_per_gib"] for s in rd)
        add("trio thread <= 0.25 CPU s per GiB read", worst <= 0.25, f"worst read workload {worst:.2f} s/GiB")
    if "small-files" in summ:
        s = summ["small-files"]
        add(">= 2,000 small files per second", s["cowfs_per_s"] >= 2000,
            f"{s['cowfs_per_s']:.0f} files/s (the disk: {s['disk_per_s']:.0f}/s)")
    return t


def section(results: dict[str, Any]) -> str:
    dp = results.get("datapath")
    if not dp:
        return "(the datapath part did not run)\n"
    summ = summarize(dp)
    lines = [f"{dp['size'] >> 20} MiB per save, write and read; {dp['small_files']} small files by "
             f"{dp.get('small_writers', 1)} threads; {dp['reps']} "
             f"interleaved pairs per workload (order alternating); {dp['cpus']} CPUs. Medians; [min-max] of the "
             "per-pair ratios.", "",
             "| workload | cowfs s | disk s | cowfs MB/s | disk MB/s | cowfs/disk time | disk/cowfs time (speed ratio) "
             "| trio thread CPU s/GiB | other threads s/GiB | daemon s/GiB |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, s in summ.items():
        lines.append(f"| {name}: {DESCRIBE[name]} | {s['cowfs_s']:.3f} | {s['disk_s']:.3f} | {s['cowfs_MBps']:.0f} | "
                     f"{s['disk_MBps']:.0f} | {s['time_ratio']:.2f} [{s['time_ratio_range'][0]:.2f}-"
                     f"{s['time_ratio_range'][1]:.2f}] | {s['speed_ratio']:.2f} [{s['speed_ratio_range'][0]:.2f}-"
                     f"{s['speed_ratio_range'][1]:.2f}] | {s['trio_s_per_gib']:.2f} | {s['workers_s_per_gib']:.2f} | "
                     f"{s['daemon_s_per_gib']:.2f} |")
    lines += ["", "**Projection** (not a measurement): the GB/s this daemon's CPU allows with N cores, taking the "
              "trio thread's CPU per GiB as serial and the rest as spread over every core: min(1 / trio s per GB, "
              "N / daemon s per GB).", "",
              "| workload | " + " | ".join(f"{n} cores" for n in PROJECT_CORES) + " |",
              "|---|" + "---|" * len(PROJECT_CORES)]
    for name, s in summ.items():
        if name == "small-files":
            continue
        lines.append(f"| {name} | " + " | ".join(f"{projection(s, n):.1f}" for n in PROJECT_CORES) + " |")
    lines += ["", "#### Issue-15 targets (against this run)", "", *target_lines(targets(summ), "REPORTED"), ""]
    return "\n".join(lines)
