"""Summaries, the Markdown tables, the issue-6 targets (MET / NOT MET) and the PNG plot.

Every number comes from the raw results of the run (results["series"], ["snapshot_10k"],
["writeback"]); nothing here is a constant about cowfs.
"""
from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from .compactreport import section, target_lines
from .docs import COMPACTION, update_docs

MB = 1e6
MiB = 2**20
GiB = 2**30


def _med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def summarize_series(s: dict[str, Any]) -> dict[str, Any]:
    rows = s["checkpoints"]
    later = rows[1:] or rows  # the first checkpoint is all new by definition
    methods: dict[str, Any] = {}
    for name in s["methods"]:
        secs = [r["saves"][name]["seconds"] for r in rows]
        durable = [r["saves"][name]["durable_seconds"] for r in rows if r["saves"][name]["durable_seconds"] is not None]
        nbytes = _med([r["saves"][name]["bytes"] for r in rows])
        methods[name] = {"median_s": _med(secs), "min_s": min(secs), "max_s": max(secs),
                         "MBps": nbytes / _med(secs) / MB, "durable_median_s": _med(durable) if durable else None,
                         "bytes": nbytes}
    safe = "hf+fsync" if "hf+fsync" in methods else "b:safe torch.save"
    plain = "hf plain" if "hf plain" in methods else "a:torch.save"
    cow_bytes = sum(r["saves"]["cowfs"]["bytes"] for r in rows)
    cow_cpu = sum(r["saves"]["cowfs"]["daemon_cpu_s"] for r in rows)
    new_frac = statistics.mean(r["cowfs_new_stored"] / r["saves"]["cowfs"]["bytes"] for r in later)
    changed_frac = statistics.mean(r["changed_bytes"] / r["tensor_bytes"] for r in later)
    rs = s["restore"]
    pr = s["prune"]
    gc = pr["gc"] or {}
    return {
        "workload": s["workload"], "description": s["description"], "checkpoints": len(rows),
        "checkpoint_bytes": methods["cowfs"]["bytes"], "methods": methods, "safe": safe, "plain": plain,
        "ratio_vs_safe": methods["cowfs"]["median_s"] / methods[safe]["median_s"],
        "ratio_vs_plain": methods["cowfs"]["median_s"] / methods[plain]["median_s"],
        "daemon_cpu_s_per_GiB": cow_cpu / (cow_bytes / GiB),
        "spilled_checkpoints": sum(1 for r in rows if r["saves"]["cowfs"].get("spilled")),
        "spilled_max": max((r["saves"]["cowfs"].get("spilled") or 0) for r in rows),
        "changed_frac": changed_frac, "new_stored_frac": new_frac, "dedup_frac": 1 - new_frac,
        "stored_after": rows[-1]["cowfs_stored"], "logical_after": rows[-1]["cowfs_logical"],
        "physical_after": rows[-1]["cowfs_physical"], "plain_du_after": rows[-1]["plain_du"],
        "unchanged_new_bytes": s["unchanged_resave_new_bytes"],
        "restore_cowfs_MBps": rs["bytes"] / _med(rs["cowfs_load_s"]) / MB, "restore_disk_MBps": rs["bytes"] / _med(rs["disk_load_s"]) / MB,
        "read_cowfs_MBps": rs["bytes"] / _med(rs["cowfs_read_s"]) / MB, "read_disk_MBps": rs["bytes"] / _med(rs["disk_read_s"]) / MB,
        "restore_reps": len(rs["cowfs_load_s"]), "stored_after_prune": pr["stats_after"]["stored_bytes"],
        "restore_loader": rs["loader"], "caches_dropped": rs["dropped_caches"],
        "snapshot_median_ms": _med([r["snapshot_s"] for r in rows]) * 1e3,
        "prune_wall_s": pr["wall_s"], "gc_s": gc.get("seconds"), "gc_bytes_freed": gc.get("bytes_freed", 0),
        "snapshots_removed": pr["snapshots_removed"],
    }


def targets(summaries: list[dict[str, Any]], snap: dict[str, Any] | None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []

    def add(name: str, met: bool | None, detail: str) -> None:
        out.append({"target": name, "met": met, "detail": detail})

    for s in summaries:
        if s["workload"] == "hf-rotation":
            continue
        bound = 1.0 if s["dedup_frac"] >= 0.5 else 1.25
        rule = "< 1.0 (>= half deduplicates)" if bound == 1.0 else "<= 1.25"
        ok = s["ratio_vs_safe"] < 1.0 if bound == 1.0 else s["ratio_vs_safe"] <= 1.25
        add(f"durable save vs (b), {s['workload']}", ok,
            f"cowfs/(b) = {s['ratio_vs_safe']:.2f}, needs {rule}; {100 * s['dedup_frac']:.0f}% of bytes deduplicated")
    for s in summaries:
        if s["workload"] == "frozen-backbone":
            gap = 100 * (s["new_stored_frac"] - s["changed_frac"])
            add("frozen backbone: new stored bytes within 5 points of the trained fraction", abs(gap) <= 5,
                f"{100 * s['new_stored_frac']:.1f}% stored per checkpoint vs {100 * s['changed_frac']:.1f}% of parameter bytes changed ({gap:+.1f} points)")
    unchanged = {s["workload"]: s["unchanged_new_bytes"] for s in summaries}
    if unchanged:
        add("unchanged files add 0 new bytes", all(v == 0 for v in unchanged.values()),
            ", ".join(f"{k}: {v} B" for k, v in unchanged.items()))
    for s in summaries:
        ratio = s["restore_cowfs_MBps"] / s["restore_disk_MBps"]
        add(f"restore from a fresh mount >= 0.8x disk, {s['workload']}", ratio >= 0.8,
            f"{s['restore_loader']}: {s['restore_cowfs_MBps']:.0f} vs {s['restore_disk_MBps']:.0f} MB/s = {ratio:.2f}x")
    if snap:
        ms = _med(snap["mkdir_s"]) * 1e3
        add(f"snapshot creation < 50 ms with {snap['files']} files", ms < 50,
            f"mkdir .snapshots/NAME median {ms:.1f} ms (control socket {_med(snap['socket_s']) * 1e3:.1f} ms, "
            f"`cowfs snapshot create` command {_med(snap['cli_s']) * 1e3:.0f} ms with interpreter start)")
    freed = [(s["gc_bytes_freed"], s["gc_s"]) for s in summaries if s["gc_s"]]
    if freed:
        rate = sum(b for b, _ in freed) / sum(t for _, t in freed) / MB
        add("gc >= 500 MB/s of live data moved", None,
            f"not applicable: cowfs gc moves no live data (it punches holes; `cowfs compact` re-encodes bodies, see the issue-14 figures). "
            f"It freed {sum(b for b, _ in freed) / MB:.0f} MB in {sum(t for _, t in freed):.2f} s of gc = {rate:.0f} MB/s freed")
    return out


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _mb(x: float) -> str:
    return f"{x / MiB:,.0f} MiB" if x >= 10 * MiB else f"{x / MiB:.1f} MiB"


def markdown(results: dict[str, Any], summaries: list[dict[str, Any]], tgts: list[dict[str, Any]]) -> str:
    lines = [f"Model: {results['model']}, {results['params'] / 1e6:.1f}M parameters; "
             f"{results['checkpoints']} checkpoints per workload, {results['steps']} optimizer step(s) apart; "
             f"disk: {results['fs']}; page cache dropped before reads: {'yes' if summaries and summaries[0]['caches_dropped'] else 'no'}; "
             f"{results['cpus']} CPUs, load average {results['loadavg_start'][0]:.1f} at the start and "
             f"{results.get('loadavg_end', [float('nan')])[0]:.1f} at the end; the run took {results.get('seconds', float('nan')) / 60:.1f} min.", ""]
    lines += ["### Save (seconds per checkpoint: median [min-max])", "",
              "| workload | checkpoint | cowfs (durable) | (b) safe torch.save | cowfs/(b) | (a) torch.save | cowfs/(a) "
              "| (c) safetensors | (c) + fsync | cowfs MB/s | close to durable: cowfs / (b) | out-of-order at fsync | daemon CPU s/GiB |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in summaries:
        m = s["methods"]

        def cell(name: str) -> str:
            x = m.get(name)
            return "-" if x is None else f"{x['median_s']:.2f} [{x['min_s']:.2f}-{x['max_s']:.2f}]"
        c, b = m["cowfs"], m[s["safe"]]
        st, stf = ("c:safetensors", "c:safetensors+fsync") if "c:safetensors" in m else ("", "")
        lines.append(
            f"| {s['workload']} | {_mb(s['checkpoint_bytes'])} | {cell('cowfs')} | {cell(s['safe'])} | {s['ratio_vs_safe']:.2f} "
            f"| {cell(s['plain'])} | {s['ratio_vs_plain']:.2f} | {cell(st)} | {cell(stf)} | {c['MBps']:.0f} "
            f"| {_s(c['durable_median_s'])} / {_s(b['durable_median_s'])} "
            f"| {s['spilled_checkpoints']}/{s['checkpoints']} (max {_mb(s['spilled_max'])}) | {s['daemon_cpu_s_per_GiB']:.2f} |")
    lines += ["", "hf-rotation: (b) is the same HF save with every file and directory fsynced, (a) without; "
              "cowfs commits each file durably at its close, so it has no separate durable part. "
              "out-of-order at fsync: checkpoints whose write session had bytes in its spill file just before fsync "
              "(writes that did not arrive as sequential appends, so streaming stopped and they are chunked at commit), "
              "and the most such bytes.", ""]
    lines += [f"### Space, restore, snapshots, gc (after {results['checkpoints']} checkpoints)", "",
              "| workload | parameter bytes changed | new stored / checkpoint | stored: cowfs / plain dir | logical | unchanged re-save "
              "| restore MB/s: cowfs fresh mount / disk | raw cold read MB/s: cowfs / disk | snapshot ms | prune + gc s | gc freed | stored after prune |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in summaries:
        lines.append(
            f"| {s['workload']} | {100 * s['changed_frac']:.1f}% | {100 * s['new_stored_frac']:.1f}% "
            f"| {_mb(s['stored_after'])} / {_mb(s['plain_du_after'])} | {_mb(s['logical_after'])} | {s['unchanged_new_bytes']} B "
            f"| {s['restore_cowfs_MBps']:.0f} / {s['restore_disk_MBps']:.0f} ({s['restore_cowfs_MBps'] / s['restore_disk_MBps']:.2f}x) "
            f"| {s['read_cowfs_MBps']:.0f} / {s['read_disk_MBps']:.0f} ({s['read_cowfs_MBps'] / s['read_disk_MBps']:.2f}x) "
            f"| {s['snapshot_median_ms']:.1f} | {s['prune_wall_s']:.2f} (gc {_s(s['gc_s'])}) | {_mb(s['gc_bytes_freed'])} | {_mb(s['stored_after_prune'])} |")
    lines += ["", "plain dir: bytes on the disk of the plain directory: every `step-N.pt` of (a) kept; for hf-rotation the "
              "rotated directory (2 checkpoints kept), while cowfs keeps every version until pruned. "
              "restore: torch.load (hf-rotation: safetensors load_file of model.safetensors) of the last checkpoint, median of "
              f"{summaries[0]['restore_reps'] if summaries else 0} cold reads (page cache dropped before each; the first from a fresh mount). "
              "prune: `prune --keep-last 1` through the control socket (one snapshot per checkpoint was taken), then gc; "
              "before it, after the restore reads, the series was compacted (`cowfs compact` + `cowfs gc`, "
              "the issue-14 section), so the bytes stored after the prune are compacted ones.", ""]
    snap = results.get("snapshot_10k")
    if snap:
        lines += [f"Snapshot with {snap['files']} files: creating the files took {snap['create_files_s']:.1f} s "
                  f"({snap['files'] / snap['create_files_s']:.0f} files/s); mkdir .snapshots/NAME "
                  f"{_med(snap['mkdir_s']) * 1e3:.1f} ms (median of {len(snap['mkdir_s'])}), control socket "
                  f"{_med(snap['socket_s']) * 1e3:.1f} ms, `cowfs snapshot create` {_med(snap['cli_s']) * 1e3:.0f} ms.", ""]
    wb = results.get("writeback")
    if wb:
        on, off = wb["median"]["on"], wb["median"]["off"]
        lines += [f"Writeback cache ({_mb(wb['bytes'])} of random fp32 tensors, torch.save + fsync into a new store, "
                  f"{len(wb['runs']) // 2} runs each, alternating; medians):", "",
                  "| writeback cache | save MB/s | fsync + close s | out of order at fsync | cold read MB/s | daemon CPU s/GiB |",
                  "|---|---|---|---|---|---|"]
        for label, x in (("on", on), ("off", off)):
            lines.append(f"| {label} | {x['save_MBps']:.0f} | {x['durable_s']:.2f} | {x['spilled_MiB']:.0f} MiB "
                         f"| {x['cold_read_MBps']:.0f} | {x['daemon_cpu_s_per_GiB']:.2f} |")
        lines.append("")
    lines += ["### Targets (against the baselines of this run)", ""] + target_lines(tgts, "N/A")
    return "\n".join(lines) + "\n"


# the HF baselines share the colour of the baseline they correspond to: (a) plain, (b) durable
STYLE = {"cowfs": ("C0", ".-"), "a:torch.save": ("C1", ".-"), "b:safe torch.save": ("C2", ".-"),
         "c:safetensors": ("C3", ".-"), "c:safetensors+fsync": ("C4", ".-"), "hf plain": ("C1", "x--"), "hf+fsync": ("C2", "x--")}


def plot(results: dict[str, Any], path: Path) -> bool:
    """Stored bytes over checkpoints (cowfs vs the plain directory) and save seconds per checkpoint."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    series = results["series"]
    fig, axes = plt.subplots(2, len(series), figsize=(3.2 * len(series), 6.4), squeeze=False)
    for i, s in enumerate(series):
        ks = [r["k"] for r in s["checkpoints"]]
        ax = axes[0][i]
        ax.plot(ks, [r["cowfs_stored"] / MiB for r in s["checkpoints"]], "o-", label="cowfs stored")
        ax.plot(ks, [r["plain_du"] / MiB for r in s["checkpoints"]], "s--", label="plain dir")
        ax.set_title(s["workload"], fontsize=9)
        ax.set_xlabel("checkpoint", fontsize=8)
        if i == 0:
            ax.set_ylabel("MiB on disk", fontsize=8)
        ax.tick_params(labelsize=7)
        ax = axes[1][i]
        for name in s["methods"]:
            color, style = STYLE.get(name, (None, ".-"))
            ax.plot(ks, [r["saves"][name]["seconds"] for r in s["checkpoints"]], style, color=color, label=name)
        ax.set_xlabel("checkpoint", fontsize=8)
        if i == 0:
            ax.set_ylabel("save seconds", fontsize=8)
        ax.set_ylim(bottom=0)
        ax.tick_params(labelsize=7)
    axes[0][0].legend(fontsize=7)
    handles, labels = {}, []
    for ax in axes[1]:
        for h, lbl in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lbl, h)
    labels = list(handles)
    fig.legend([handles[k] for k in labels], labels, loc="lower center", ncol=len(labels), fontsize=7)
    fig.suptitle(f"cowfs vs plain directory: {results['model']}, {results['params'] / 1e6:.0f}M params", fontsize=10)
    fig.tight_layout(rect=(0, 0.05, 1, 0.96))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> int:
    """`python -m tools.bench.report RESULTS.json [PLOT.png] [--update-docs]`: print the tables of a
    finished run again, redraw its plot, and optionally put both into docs/benchmarks.md."""
    import json
    import sys

    args = sys.argv[1:] if argv is None else argv
    docs = "--update-docs" in args
    args = [a for a in args if a != "--update-docs"]
    if not args:
        print("usage: python -m tools.bench.report RESULTS.json [PLOT.png] [--update-docs]", file=sys.stderr)
        return 2
    results = json.loads(Path(args[0]).read_text())
    summaries = [summarize_series(s) for s in results["series"]]
    md = markdown(results, summaries, targets(summaries, results.get("snapshot_10k")))
    c_md = section(results)
    print(md)
    print("### Compaction (issue 14)\n")
    print(c_md)
    png = Path(args[1]) if len(args) > 1 else None
    if png is not None and not plot(results, png):
        print("matplotlib is not installed", file=sys.stderr)
        return 1
    if docs:
        update_docs(md, png, results["command"], results["started"])
        if results.get("compaction"):
            update_docs(c_md, None, results["command"], results["started"], section=COMPACTION)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
