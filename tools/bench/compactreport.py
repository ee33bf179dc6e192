"""The issue-14 part of the report: summaries of the compaction workload
(tools/bench/compaction.py) and of the series' compaction step (series.compact_series), the
Markdown tables, and the issue-14 targets as MET / NOT MET against the same run.

Every number comes from the raw results of the run; the thresholds are the issue's.
"""
from __future__ import annotations

import statistics
from typing import Any

from .compactstep import compact_MBps

MB = 1e6
MiB = 2**20
RATIO_TARGETS = {"bf16": 0.45, "fp32": 0.70}
SAVE_SLACK = 1.05  # durable save with compaction on within 5% of off
READ_NEWEST = 0.9  # cold read of the newest within 10% of compaction off
READ_OLDEST = 0.5  # the oldest at >= 0.5x the newest
COMPACT_MBPS = 200.0
T4_WORKLOADS = ("frozen-backbone", "sparse-embedding")


def _med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def _spread(xs: list[float], fmt: str = "{:.3f}") -> str:
    if not xs:
        return "-"
    if len(xs) == 1:
        return fmt.format(xs[0])
    return f"{fmt.format(_med(xs))} [{fmt.format(min(xs))}-{fmt.format(max(xs))}]"


def _ratio(st: dict[str, Any], key: str = "stored_bytes") -> float:
    return st[key] / st["logical_bytes"] if st["logical_bytes"] else float("nan")


def _reads(arms: list[dict[str, Any]], key: str, label: str) -> list[float]:
    """MB/s of every cold read of `label` in `key` over the arms (one figure per read)."""
    return [a[key][label]["bytes"] / s / MB for a in arms for s in a[key][label]["seconds"]]


def per_version(off: list[dict[str, Any]]) -> dict[str, float]:
    """Median MB/s of every checkpoint's cold reads in the compacted stores, oldest first."""
    names = off[0]["info"]["versions"]
    return {v: _med(_reads(off, "reads_versions", v)) for v in names}


def summarize_dtype(dtype: str, arms: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    off, idle = arms["off"], arms["idle"]
    daemon = [run for a in idle for run in a["daemon_log"]["runs"]]
    peers = next((a["peers"] for a in off if a.get("peers")), {})
    written = off[0]["stats_written"]
    return {
        "dtype": dtype, "reps": len(off), "logical": written["logical_bytes"],
        "checkpoint_bytes": written["logical_bytes"] / max(1, len(off[0]["save_s"])),
        "stored_saved": [_ratio(a["stats_written"]) for a in off],
        "ratio_off": [_ratio(a["stats_compacted"]) for a in off],
        "ratio_idle": [_ratio(a["stats_compacted"]) for a in idle],
        "stats_ratio": [a["stats_compacted"]["stored_ratio"] for a in off],
        "physical_ratio": [_ratio(a["stats_compacted"], "physical_bytes") for a in off],
        "physical": [a["stats_compacted"]["physical_bytes"] for a in off],
        "written": [a["written_compacted"] for a in off],
        "written_ratio": [a["written_compacted"] / a["stats_compacted"]["logical_bytes"] for a in off],
        "codecs": off[0]["stats_compacted"]["codecs"],
        "save_off": [s for a in off for s in a["save_s"]], "save_idle": [s for a in idle for s in a["save_s"]],
        "train_off": [a["train_wall_s"] for a in off], "train_idle": [a["train_wall_s"] for a in idle],
        "idle_left": [a["idle_left"] for a in idle], "idle_wait": [a["idle_wait_s"] for a in idle],
        "daemon_runs": len(daemon), "daemon_bytes": sum(r["bytes"] for r in daemon),
        "daemon_seconds": sum(r["seconds"] for r in daemon), "daemon_deltas": sum(r["deltas"] for r in daemon),
        "read_saved": _reads(off, "reads_saved", "newest"), "read_newest": _reads(off, "reads_compacted", "newest"),
        "read_oldest": _reads(off, "reads_compacted", "oldest"), "read_idle_newest": _reads(idle, "reads_compacted", "newest"),
        "read_versions": per_version(off),
        "compact_MBps": [compact_MBps(a["step"]) for a in off],
        "compact_wall_MBps": [compact_MBps(a["step"], wall=True) for a in off],
        "compact_s": [a["step"]["compact"]["seconds"] for a in off],
        "compact_bytes": off[0]["step"]["compact"]["logical_bytes"],
        "deltas": off[0]["step"]["compact"]["deltas"], "pieces": off[0]["step"]["compact"]["pieces"],
        "gc_s": [a["step"]["gc"]["seconds"] for a in off],
        "identical": all(a["identical"] for a in off), "fsck_clean": all(a["fsck"]["clean"] for a in off),
        "problems": [p for a in off + idle for p in a["daemon_log"]["problems"]],
        "errors": [e for a in off + idle for e in a["step"]["compact"]["errors"]],
        "caches_dropped": all(a["reads_compacted"]["caches_dropped"] for a in off + idle),
        "peers": {k: (v["ratio"] if v else None) for k, v in peers.items()}, "peer_tools": peers,
    }


def summarize_plain(dtype: str, a: dict[str, Any]) -> dict[str, Any]:
    return {"dtype": dtype, "logical": a["stats_written"]["logical_bytes"], "ratio": _ratio(a["stats_compacted"]),
            "stats_ratio": a["stats_compacted"]["stored_ratio"], "physical": a["stats_compacted"]["physical_bytes"],
            "written": a["written_compacted"], "versions": len(a["save_s"]),
            "compact_MBps": compact_MBps(a["step"]), "save": a["save_s"], "identical": a["identical"],
            "fsck_clean": a["fsck"]["clean"], "errors": a["step"]["compact"]["errors"]}


def summarize(results: dict[str, Any]) -> dict[str, Any]:
    c = results["compaction"]
    return {"idle": c["idle"], "trainer": [summarize_dtype(d, arms) for d, arms in c["trainer"].items()],
            "plain": [summarize_plain(d, a) for d, a in c["plain"].items()]}


def series_compaction(s: dict[str, Any]) -> dict[str, Any] | None:
    """What a series of series.py measured around `cowfs compact` (series.compact_series)."""
    comp = s.get("compaction")
    if not comp:
        return None
    b, a = comp["stats_before"], comp["stats_after"]
    return {"workload": s["workload"], "logical": b["logical_bytes"], "stored_before": b["stored_bytes"],
            "stored_after": a["stored_bytes"], "physical_before": b["physical_bytes"], "physical_after": a["physical_bytes"],
            "MBps": compact_MBps(comp["step"]), "unchanged_before": s["unchanged_resave_new_bytes"],
            "resave_raw": comp["resave_new_bytes"], "resave_compacted": comp["resave_new_bytes_compacted"]}


def targets(summary: dict[str, Any] | None, series: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []

    def add(name: str, met: bool | None, detail: str) -> None:
        out.append({"target": name, "met": met, "detail": detail})

    for t in (summary or {}).get("trainer", []):
        d, bound = t["dtype"], RATIO_TARGETS.get(t["dtype"], float("nan"))
        r = _med(t["ratio_off"])
        add(f"issue 14: full fine-tune {d}, stored/logical after compact + gc <= {bound:.2f}", r <= bound,
            f"{_spread(t['ratio_off'])} over {t['reps']} runs ({t['logical'] / MB:.0f} MB logical; "
            f"stats stored_ratio {_spread(t['stats_ratio'])}; physical/logical {_spread(t['physical_ratio'])} allocated, "
            f"{_spread(t['written_ratio'])} written; "
            f"compacted by the idle daemon {_spread(t['ratio_idle'])}; as saved {_spread(t['stored_saved'])})")
    for p in (summary or {}).get("plain", []):
        add(f"issue 14: torch.save rewriting one path, {p['dtype']} (no bound)", None,
            f"stored/logical {p['ratio']:.3f} after compact + gc ({p['logical'] / MB:.0f} MB logical, {p['versions']} versions kept)")
    for s in (x for x in series if x and x["workload"] in T4_WORKLOADS):
        before, after = s["stored_before"] / s["logical"], s["stored_after"] / s["logical"]
        add(f"issue 14: {s['workload']} no worse than today", s["stored_after"] <= s["stored_before"],
            f"stored/logical {after:.3f} after compact + gc vs {before:.3f} as saved")
    resaves = [s for s in series if s]
    if resaves:
        add("issue 14: unchanged re-save adds 0 bytes, before and after compaction",
            all(s["unchanged_before"] == 0 and s["resave_compacted"] == 0 for s in resaves),
            "; ".join(f"{s['workload']}: {s['unchanged_before']} B before, {s['resave_compacted']} B after compact + gc "
                      f"({s['resave_raw'] / MiB:.1f} MiB as saved, until compacted)" for s in resaves))
    for t in (summary or {}).get("trainer", []):
        off, on = _med(t["save_off"]), _med(t["save_idle"])
        add(f"issue 14: durable save with idle compaction within 5% of compaction off, {t['dtype']}",
            on <= SAVE_SLACK * off,
            f"Trainer save s median {on:.3f} (--compact-idle {summary['idle'] if summary else '?'}) vs {off:.3f} (off) = {on / off:.2f}x; "
            f"{len(t['save_idle'])} and {len(t['save_off'])} saves; the daemon compacted {t['daemon_runs']} times between saves")
    for t in (summary or {}).get("trainer", []):
        saved, new, old = _med(t["read_saved"]), _med(t["read_newest"]), _med(t["read_oldest"])
        add(f"issue 14: cold read of the newest within 10% of compaction off, {t['dtype']}", new >= READ_NEWEST * saved,
            f"{new:.0f} MB/s compacted vs {saved:.0f} MB/s as saved = {new / saved:.2f}x (median of {len(t['read_newest'])} reads)")
        vs = t["read_versions"]
        slow = min(vs, key=lambda k: vs[k])
        add(f"issue 14: cold read of the oldest >= 0.5x the newest, {t['dtype']}", old >= READ_OLDEST * new,
            f"{old:.0f} vs {new:.0f} MB/s = {old / new:.2f}x; the slowest checkpoint ({slow}): {vs[slow]:.0f} MB/s "
            f"= {vs[slow] / new:.2f}x (median of its reads)")
    for t in (summary or {}).get("trainer", []):
        r = _med(t["compact_MBps"])
        add(f"issue 14: compaction >= 200 MB/s of checkpoint data, {t['dtype']}", r >= COMPACT_MBPS,
            f"{_spread(t['compact_MBps'], '{:.0f}')} MB/s ({t['compact_bytes'] / MB:.0f} MB in {_spread(t['compact_s'], '{:.2f}')} s "
            f"as `cowfs compact` reports; {_spread(t['compact_wall_MBps'], '{:.0f}')} MB/s over the command's wall time)")
    for t in (summary or {}).get("trainer", []):
        peers = ", ".join(f"{k} {v:.3f}" if v is not None else f"{k} not installed" for k, v in t["peers"].items())
        add(f"issue 14: restic and borg on the same series, {t['dtype']} (side by side)", None,
            f"cowfs {_med(t['ratio_off']):.3f}; {peers or 'not run'}")
    return out


def markdown(results: dict[str, Any], summary: dict[str, Any] | None, series: list[dict[str, Any]],
             tgts: list[dict[str, Any]]) -> str:
    lines: list[str] = []
    if summary:
        c = results["compaction"]
        lines += [f"Trainer series: GPT-2 config 4 layers x 256 (vocabulary 8192), AdamW lr 5e-5, a checkpoint every "
                  f"{c['save_steps']} steps, {c['checkpoints']} checkpoints written by Trainer into the mount, no rotation; "
                  f"{c['reps']} runs per dtype and arm (compaction off / `--compact-idle {c['idle']}`), alternating; "
                  f"cold reads {c['read_reps']} per run, page cache dropped before each: "
                  f"{'yes' if all(t['caches_dropped'] for t in summary['trainer']) else 'no'}.", "",
                  "#### Space (stored/logical; median [min-max] over the runs)", "",
                  "| series | logical | as saved | after compact + gc | stats stored_ratio | physical after gc: allocated / written | "
                  "compacted by the idle daemon | restic | borg |", "|---|---|---|---|---|---|---|---|---|"]
        for t in summary["trainer"]:
            peer = {k: ("-" if v is None else f"{v:.3f}") for k, v in t["peers"].items()}
            lines.append(f"| Trainer {t['dtype']} | {t['logical'] / MB:.0f} MB | {_spread(t['stored_saved'])} | "
                         f"{_spread(t['ratio_off'])} | {_spread(t['stats_ratio'])} | "
                         f"{_med(t['physical']) / MB:.0f} ({_med(t['physical_ratio']):.3f}) / "
                         f"{_med(t['written']) / MB:.0f} MB ({_med(t['written_ratio']):.3f}) | "
                         f"{_spread(t['ratio_idle'])} | {peer.get('restic', '-')} | {peer.get('borg', '-')} |")
        for p in summary["plain"]:
            lines.append(f"| torch.save one path {p['dtype']} | {p['logical'] / MB:.0f} MB | 1.000 | {p['ratio']:.3f} | "
                         f"{p['stats_ratio']:.3f} | {p['physical'] / MB:.0f} ({p['physical'] / p['logical']:.3f}) / "
                         f"{p['written'] / MB:.0f} MB ({p['written'] / p['logical']:.3f}) | - | - | - |")
        lines += ["", "Codecs after compact + gc (first run): " + "; ".join(
            f"{t['dtype']}: " + ", ".join(f"{k} {v['chunks']} chunks, {v['unique_bytes'] / MB:.1f} -> {v['stored_bytes'] / MB:.1f} MB"
                                          for k, v in t["codecs"].items()) for t in summary["trainer"]) + ".", ""]
        lines += ["#### Durable save through the mount (Trainer's `_save_checkpoint`, seconds: median [min-max])", "",
                  "| series | checkpoint | compaction off | idle compaction | idle/off | daemon compactions between saves | "
                  "left at the end, waited | training wall s off / idle |", "|---|---|---|---|---|---|---|---|"]
        for t in summary["trainer"]:
            rate = t["daemon_bytes"] / t["daemon_seconds"] / MB if t["daemon_seconds"] else float("nan")
            lines.append(f"| {t['dtype']} | {t['checkpoint_bytes'] / MB:.1f} MB | {_spread(t['save_off'])} | "
                         f"{_spread(t['save_idle'])} | {_med(t['save_idle']) / _med(t['save_off']):.2f} | "
                         f"{t['daemon_runs']} runs, {t['daemon_bytes'] / MB:.0f} MB in {t['daemon_seconds']:.1f} s ({rate:.0f} MB/s), "
                         f"{t['daemon_deltas']} deltas | {_spread([x / MB for x in t['idle_left']], '{:.0f}')} MB, "
                         f"{_spread(t['idle_wait'], '{:.1f}')} s | {_spread(t['train_off'], '{:.0f}')} / {_spread(t['train_idle'], '{:.0f}')} |")
        lines += ["", "#### Cold reads of a whole checkpoint directory (MB/s: median [min-max] of every read)", "",
                  "| series | newest, as saved | newest, compacted | compacted/saved | oldest, compacted | oldest/newest | "
                  "newest, compacted by the idle daemon |", "|---|---|---|---|---|---|---|"]
        for t in summary["trainer"]:
            lines.append(f"| {t['dtype']} | {_spread(t['read_saved'], '{:.0f}')} | {_spread(t['read_newest'], '{:.0f}')} | "
                         f"{_med(t['read_newest']) / _med(t['read_saved']):.2f} | {_spread(t['read_oldest'], '{:.0f}')} | "
                         f"{_med(t['read_oldest']) / _med(t['read_newest']):.2f} | {_spread(t['read_idle_newest'], '{:.0f}')} |")
        names = summary["trainer"][0]["read_versions"]
        lines += ["", "Every checkpoint of the compacted store, oldest first (MB/s, median of its cold reads):", "",
                  "| series | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
        for t in summary["trainer"]:
            lines.append(f"| {t['dtype']} | " + " | ".join(f"{x:.0f}" for x in t["read_versions"].values()) + " |")
        lines += ["", f"#### Compaction throughput (`cowfs compact` of all {c['checkpoints']} checkpoints at once, then `cowfs gc`)", "",
                  "| series | bytes looked at | tensor pieces / turned into deltas | compact s (reported) | MB/s | "
                  "MB/s over the command's wall time | gc s |", "|---|---|---|---|---|---|---|"]
        for t in summary["trainer"]:
            lines.append(f"| {t['dtype']} | {t['compact_bytes'] / MB:.0f} MB | {t['pieces']} / {t['deltas']} | "
                         f"{_spread(t['compact_s'], '{:.2f}')} | {_spread(t['compact_MBps'], '{:.0f}')} | "
                         f"{_spread(t['compact_wall_MBps'], '{:.0f}')} | {_spread(t['gc_s'], '{:.2f}')} |")
        for p in summary["plain"]:
            lines.append(f"| torch.save one path {p['dtype']} | {p['logical'] / MB:.0f} MB | - | - | {p['compact_MBps']:.0f} | - | - |")
        checks = [f"{t['dtype']}: files read back identical {'yes' if t['identical'] else 'NO'}, fsck "
                  f"{'clean' if t['fsck_clean'] else 'NOT clean'}" for t in summary["trainer"]]
        checks += [f"torch.save {p['dtype']}: identical {'yes' if p['identical'] else 'NO'}, fsck "
                   f"{'clean' if p['fsck_clean'] else 'NOT clean'}" for p in summary["plain"]]
        problems = [x for t in summary["trainer"] for x in t["problems"] + t["errors"]]
        problems += [x for p in summary["plain"] for x in p["errors"]]
        lines += ["", "Checks after compaction: " + "; ".join(checks) + ". Daemon warnings, errors and compaction errors: "
                  + ("; ".join(problems[:5]) if problems else "none") + ".", ""]
        tools = {v["tool"] + " (" + v["settings"] + ")" for t in summary["trainer"] for v in t["peer_tools"].values() if v}
        if tools:
            lines += ["Peers: " + "; ".join(sorted(tools)) + ", one backup per checkpoint, repository size on disk over the "
                      "series' logical size.", ""]
    rows = [s for s in series if s]
    if rows:
        lines += ["#### The issue-6 series before and after `cowfs compact` + `cowfs gc`", "",
                  "| workload | logical | stored as saved | after compact + gc | compact MB/s | unchanged re-save: before "
                  "compaction | after it, as saved | after compact + gc |", "|---|---|---|---|---|---|---|---|"]
        for s in rows:
            lines.append(f"| {s['workload']} | {s['logical'] / MiB:,.0f} MiB | {s['stored_before'] / MiB:,.0f} MiB "
                         f"({s['stored_before'] / s['logical']:.3f}) | {s['stored_after'] / MiB:,.0f} MiB "
                         f"({s['stored_after'] / s['logical']:.3f}) | {s['MBps']:.0f} | {s['unchanged_before']} B | "
                         f"{s['resave_raw'] / MiB:.1f} MiB | {s['resave_compacted']} B |")
        lines.append("")
    lines += ["#### Issue-14 targets (against this run)", ""] + target_lines(tgts, "REPORTED")
    return "\n".join(lines) + "\n"


def target_lines(tgts: list[dict[str, Any]], no_bound: str) -> list[str]:
    """One Markdown line per target: MET, NOT MET, or `no_bound` where there is none."""
    return [f"- **{no_bound if t['met'] is None else ('MET' if t['met'] else 'NOT MET')}** {t['target']}: {t['detail']}"
            for t in tgts]


def section(results: dict[str, Any]) -> str:
    """The issue-14 tables and targets of a run (the compaction part and the series'
    compaction step); the summary and the targets are kept in `results` for its JSON."""
    summary = summarize(results) if results.get("compaction") else None
    series = [x for x in (series_compaction(s) for s in results["series"]) if x]
    tgts = targets(summary, series)
    results["compaction_summary"], results["compaction_targets"] = summary, tgts
    return markdown(results, summary, series, tgts)
