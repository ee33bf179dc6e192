"""The pure side of the scaling part of the benchmark (issue 33; tools/bench/scaling.py
measures): its options, the runs summed up per part and stream count, one Markdown table per
part, and the issue's targets as MET / NOT MET (or "not judged here" where the machine is not
the one a target names).

Functions of the arguments and of the raw results (results["scaling"]); nothing here measures
anything, and the thresholds are the issue's.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Any

MIB = 1 << 20
GIB = 1 << 30
PARTS = ("write", "read", "torch-save", "torch-load")
DESCRIBE = {
    "write": "S streams, 4 MiB write() calls + fsync, new random bytes",
    "read": "S streams, 4 MiB reads, cold (page cache dropped, cowfs remounted)",
    "torch-save": "torch.save of random fp32 tensors + fsync",
    "torch-load": "torch.load (mmap=False), cold",
}
WRITE_PARTS = ("write", "torch-save")
READ_PARTS = ("read", "torch-load")

# the targets
JUDGE_CORES = 16  # the throughput targets are for a 16-core machine ...
JUDGE_FS = "tmpfs"  # ... with a RAM-backed store
MANY_STREAMS = 16
MANY_WRITE_GBPS = 3.0
MANY_READ_GBPS = 4.0
ONE_WRITE_GBPS = 1.2
ONE_READ_GBPS = 2.5
TORCH_SAVE_RATIO = 0.8
TORCH_LOAD_RATIO = 0.9
CPU_PER_GIB_WRITTEN = 0.8
CPU_PER_GIB_READ = 0.4


WRITEBACK_FLAG = {"on": ", --writeback-cache", "off": ", --no-writeback-cache", "default": ""}


@dataclasses.dataclass
class ScalingOptions:
    streams: list[int]
    mib_per_stream: int
    reps: int = 2
    torch_gib: float = 0.25
    workers: int | None = None  # cowfs mount --workers
    writeback: str = "default"  # cowfs mount --writeback-cache ("on"), --no-writeback-cache ("off") or neither
    tmpfs: bool = False
    tmpfs_size: str | None = None  # None: the largest stream count and the torch file, in both arms at once
    budget_s: float | None = None

    def tmpfs_bytes(self) -> int:
        if self.tmpfs_size:
            return parse_size(self.tmpfs_size)
        # the cowfs arm's store and the plain arm's files can both be there (the store's space
        # comes back at its gc, its log segments only as whole segments)
        need = max(self.streams) * self.mib_per_stream * MIB + self.torch_gib * GIB
        return int(2 * need * 1.25) + GIB


def parse_size(text: str) -> int:
    """"24G", "512M", "1048576" -> bytes."""
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    units = {"K": 1 << 10, "M": MIB, "G": GIB, "T": 1 << 40}
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def parse_streams(text: str) -> list[int]:
    streams = [int(x) for x in text.split(",") if x.strip()]
    if not streams or min(streams) < 1:
        raise ValueError(f"--streams wants positive counts, comma-separated, not {text!r}")
    return streams


def options_from_args(args: Any) -> ScalingOptions:
    """The part's options from tools/bench/run.py's arguments (quick or --full defaults)."""
    mib = args.mib_per_stream if args.mib_per_stream is not None else (1024 if args.full else 256)
    torch_gib = args.torch_gib if args.torch_gib is not None else (4.0 if args.full else 0.25)
    if mib < 1 or args.reps < 1 or torch_gib < 0 or not math.isfinite(torch_gib):
        raise ValueError("--mib-per-stream and --reps want at least 1, --torch-gib at least 0")
    return ScalingOptions(streams=parse_streams(args.streams), mib_per_stream=mib, reps=args.reps, torch_gib=torch_gib,
                          workers=args.workers, writeback=args.scaling_writeback, tmpfs=args.tmpfs,
                          tmpfs_size=args.tmpfs_size, budget_s=args.budget_s)


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def spread(xs: list[float], fmt: str = "{:.2f}") -> str:
    """"median [min-max]" of the figures, the lone figure for one, "-" for none."""
    if not xs:
        return "-"
    if len(xs) == 1:
        return fmt.format(xs[0])
    return f"{fmt.format(med(xs))} [{fmt.format(min(xs))}-{fmt.format(max(xs))}]"


def gbps(run: dict[str, Any]) -> float:
    """GB/s (1e9 bytes per second) of one run: every stream's bytes over the wall time of all."""
    return run["bytes"] / 1e9 / run["wall_s"]


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (part, S), parts in PARTS order and S ascending: GB/s of each rep per arm,
    the cowfs/plain GB/s ratio of each rep that has both arms, the daemon's CPU seconds per
    GiB of each cowfs run and the busy cores (machine CPU seconds / wall seconds) per arm."""
    keys = sorted({(r["part"], r["S"]) for r in runs}, key=lambda k: (PARTS.index(k[0]), k[1]))
    rows: list[dict[str, Any]] = []
    for part, s in keys:
        mine = [r for r in runs if r["part"] == part and r["S"] == s]
        by_arm: dict[str, dict[int, dict[str, Any]]] = {"cowfs": {}, "plain": {}}
        for r in mine:
            by_arm[r["arm"]][r["rep"]] = r
        cow, plain = by_arm["cowfs"], by_arm["plain"]
        rows.append({
            "part": part, "S": s,
            "cowfs_gbps": [gbps(cow[k]) for k in sorted(cow)],
            "plain_gbps": [gbps(plain[k]) for k in sorted(plain)],
            "ratio": [gbps(cow[k]) / gbps(plain[k]) for k in sorted(cow) if k in plain],
            "daemon_s_per_gib": [cow[k]["daemon_cpu_s"] / (cow[k]["bytes"] / GIB) for k in sorted(cow)
                                 if cow[k].get("daemon_cpu_s") is not None],
            "busy_cowfs": [cow[k]["busy_cpu_s"] / cow[k]["wall_s"] for k in sorted(cow)],
            "busy_plain": [plain[k]["busy_cpu_s"] / plain[k]["wall_s"] for k in sorted(plain)],
            "reps": max(len(cow), len(plain)),
        })
    return rows


def judged_here(cpus: int, fs_type: str) -> str | None:
    """None where the 16-core RAM-backed targets apply, else why they are not judged."""
    if cpus >= JUDGE_CORES and fs_type == JUDGE_FS:
        return None
    return f"not judged here ({cpus} cores, {fs_type})"


def _row(rows: list[dict[str, Any]], part: str, s: int) -> dict[str, Any] | None:
    return next((r for r in rows if r["part"] == part and r["S"] == s), None)


def _target(name: str, met: bool | None, status: str, detail: str) -> dict[str, Any]:
    return {"target": name, "met": met, "status": status, "detail": detail}


def targets(rows: list[dict[str, Any]], cpus: int, fs_type: str, torch_skipped: bool = False) -> list[dict[str, Any]]:
    """Every issue-33 target: met (True / False), or None with its status ("not judged here
    (N cores, FS)", "not measured") where it is not judged."""
    out: list[dict[str, Any]] = []
    not_here = judged_here(cpus, fs_type)
    machine = f"{JUDGE_CORES}-core machine, RAM-backed store"

    def judge(name: str, figures: list[float], bound: float, unit: str, missing: str) -> None:
        if not figures:
            out.append(_target(name, None, not_here or "not measured", f"not measured: {missing}"))
            return
        value = med(figures)
        detail = f"{spread(figures)}{unit} over {len(figures)} rep(s)"
        if not_here:
            out.append(_target(name, None, not_here, f"measured {detail}"))
        else:
            met = value >= bound
            out.append(_target(name, met, "MET" if met else "NOT MET", detail))

    for part, s, bound, what in (("write", MANY_STREAMS, MANY_WRITE_GBPS, "write"),
                                 ("read", MANY_STREAMS, MANY_READ_GBPS, "cold-read"),
                                 ("write", 1, ONE_WRITE_GBPS, "write"),
                                 ("read", 1, ONE_READ_GBPS, "cold-read")):
        row = _row(rows, part, s)
        streams = f"{s} stream{'s' if s > 1 else ''}"
        judge(f"{machine}: {streams} {what} >= {bound} GB/s", row["cowfs_gbps"] if row else [], bound, " GB/s",
              f"no run with {streams}")
    for part, bound, label in (("torch-save", TORCH_SAVE_RATIO, "torch.save"),
                               ("torch-load", TORCH_LOAD_RATIO, "torch.load")):
        row = _row(rows, part, 1)
        judge(f"{machine}: {label} >= {bound}x the same on plain tmpfs", row["ratio"] if row else [], bound,
              " (cowfs/plain GB/s)",
              "torch skipped (--torch-gib 0)" if torch_skipped else f"no {label} run")
    for parts, bound, what in ((WRITE_PARTS, CPU_PER_GIB_WRITTEN, "written"), (READ_PARTS, CPU_PER_GIB_READ, "read")):
        per = [(r, med(r["daemon_s_per_gib"])) for r in rows if r["part"] in parts and r["daemon_s_per_gib"]]
        name = f"any machine: daemon CPU per GiB {what} <= {bound} s"
        if not per:
            out.append(_target(name, None, "not measured", f"no cowfs run that {what} data"))
            continue
        worst_row, worst = max(per, key=lambda p: p[1])
        met = worst <= bound
        each = ", ".join(f"{r['part']} S={r['S']} {v:.2f}" for r, v in per)
        out.append(_target(name, met, "MET" if met else "NOT MET",
                           f"worst {worst:.2f} s/GiB ({worst_row['part']} S={worst_row['S']}, "
                           f"{spread(worst_row['daemon_s_per_gib'])}); medians: {each}"))
    return out


def target_lines(tgts: list[dict[str, Any]]) -> list[str]:
    return [f"- **{t['status']}** {t['target']}: {t['detail']}" for t in tgts]


def table(rows: list[dict[str, Any]], part: str) -> list[str]:
    """The Markdown table of one part: a line per stream count."""
    lines = [f"**{part}**: {DESCRIBE[part]}", "",
             "| part | S | cowfs GB/s | plain GB/s | cowfs/plain | daemon CPU s/GiB | busy cores cowfs | busy cores plain | reps |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["part"] != part:
            continue
        lines.append(f"| {part} | {r['S']} | {spread(r['cowfs_gbps'])} | {spread(r['plain_gbps'])} | "
                     f"{spread(r['ratio'])} | {spread(r['daemon_s_per_gib'])} | {spread(r['busy_cowfs'], '{:.1f}')} | "
                     f"{spread(r['busy_plain'], '{:.1f}')} | {r['reps']} |")
    return lines


def thread_table(runs: list[dict[str, Any]]) -> list[str]:
    """Where the daemon's CPU went: per part and S, the CPU seconds per GiB of each thread name
    (median over the cowfs reps; the names that used the most first), and the busiest single
    thread's CPU over the wall time (near 1.0: that thread bounds the run)."""
    mine = [r for r in runs if r["arm"] == "cowfs" and r.get("daemon_threads")]
    if not mine:
        return []
    totals: dict[str, float] = {}
    for r in mine:
        for name, cpu in r["daemon_threads"].items():
            totals[name] = totals.get(name, 0.0) + cpu / (r["bytes"] / GIB)
    names = sorted(totals, key=lambda n: -totals[n])
    lines = ["**daemon threads**: CPU s per GiB per thread name (median over reps); busiest = one thread's "
             "CPU / wall time, the most of any thread (near 1.0: it bounds the run)", "",
             "| part | S | " + " | ".join(names) + " | busiest |",
             "|---|---|" + "---|" * (len(names) + 1)]
    keys = sorted({(r["part"], r["S"]) for r in mine}, key=lambda k: (PARTS.index(k[0]), k[1]))
    for part, s in keys:
        rs = [r for r in mine if (r["part"], r["S"]) == (part, s)]
        cells = [f"{med([r['daemon_threads'].get(n, 0.0) / (r['bytes'] / GIB) for r in rs]):.2f}" for n in names]
        busiest = [r["busiest_thread"] for r in rs if r.get("busiest_thread")]
        top = max(busiest, key=lambda b: b[1]) if busiest else ("-", 0.0)
        lines.append(f"| {part} | {s} | " + " | ".join(cells) + f" | {top[0]} {top[1]:.2f} |")
    return lines


def markdown(sc: dict[str, Any], rows: list[dict[str, Any]], tgts: list[dict[str, Any]]) -> str:
    if not sc.get("torch_gib"):
        torch_note = "torch: skipped (--torch-gib 0)"
    elif sc.get("torch_bytes"):
        torch_note = f"torch: a {sc['torch_bytes'] / GIB:.3g} GiB file per torch.save"
    else:
        torch_note = f"torch: {sc['torch_gib']:g} GiB asked for, not run"
    lines = [f"One mount (`cowfs init --device file`, `--compact-idle off`"
             f"{', --workers ' + str(sc['workers']) if sc.get('workers') else ''}"
             f"{WRITEBACK_FLAG.get(sc.get('writeback', 'default'), '')}) against a plain directory, both in "
             f"{sc['fs']}; {sc['cpus']} CPUs; pyfuse3 {sc.get('pyfuse3', 'unknown')}; {sc['mib_per_stream']} MiB "
             f"per stream; {torch_note}; "
             f"{sc['reps']} rep(s) per S, cowfs and plain alternating first; page cache dropped before reads: "
             f"{'yes' if sc.get('caches_dropped') else 'NO (not root)'}. GB/s = 1e9 bytes over the wall time of all "
             "streams; figures are median [min-max] over reps; busy cores = machine CPU seconds (/proc/stat) / wall "
             "seconds.", ""]
    if sc.get("skipped"):
        lines += [f"Budget of {sc['budget_s']:.0f} s spent after {sc.get('elapsed_s', 0):.0f} s; skipped: "
                  + "; ".join(sc["skipped"]) + ".", ""]
    for part in PARTS:
        if any(r["part"] == part for r in rows):
            lines += [*table(rows, part), ""]
    threads = thread_table(sc["runs"])
    if threads:
        lines += [*threads, ""]
    lines += ["#### Issue-33 targets (against this run)", "", *target_lines(tgts), ""]
    return "\n".join(lines)


def section(results: dict[str, Any]) -> str:
    """The scaling tables and targets of a run; its rows and targets are kept in
    results["scaling"] for the JSON."""
    sc = results.get("scaling")
    if not sc:
        return "(the scaling part did not run)\n"
    rows = summarize(sc["runs"])
    tgts = targets(rows, sc["cpus"], sc["fs_type"], torch_skipped=not sc.get("torch_gib"))
    sc["summary"], sc["targets"] = rows, tgts
    return markdown(sc, rows, tgts)
