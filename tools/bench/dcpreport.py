"""The pure side of the dcp-ranks part (issue 34; tools/bench/dcp_ranks.py measures): one
Markdown table of GB/s and seconds per arm, and the issue's 16-core targets as MET / NOT MET
(or "not judged here" off a 16-core machine with the store in RAM). Functions of the raw
results (results["dcp_ranks"]); nothing here measures anything."""
from __future__ import annotations

import statistics
from typing import Any

JUDGE_CORES = 16
JUDGE_FS = "tmpfs"
SAVE_GBPS = 5.0  # aggregate, cowfs.dcp.Writer
SAVE_RATIO = 0.8  # of FileSystemWriter into the plain directory
LOAD_RATIO = 0.8
STALL_RATIO = 1.1  # async_save's stall, of the same into the plain directory

ROWS = (  # (label, key, unit): unit "GB/s" turns seconds into bytes / seconds
    ("dcp.save, cowfs.dcp.Writer", "save_cowfs_s", "GB/s"),
    ("dcp.save, FileSystemWriter in the plain directory", "save_plain_s", "GB/s"),
    ("dcp.save, FileSystemWriter through the mount", "save_fuse_s", "GB/s"),
    ("dcp.load (cold), cowfs.dcp.Reader", "load_cowfs_s", "GB/s"),
    ("dcp.load (cold), FileSystemReader in the plain directory", "load_plain_s", "GB/s"),
    ("dcp.load (cold), FileSystemReader through the mount", "load_fuse_s", "GB/s"),
    ("async_save stall, cowfs.dcp.Writer", "async_cowfs_stall_s", "s"),
    ("async_save stall, FileSystemWriter in the plain directory", "async_plain_stall_s", "s"),
    ("async_save until done, cowfs.dcp.Writer", "async_cowfs_done_s", "s"),
    ("async_save until done, FileSystemWriter in the plain directory", "async_plain_done_s", "s"),
)


def _figures(result: dict[str, Any], key: str, unit: str) -> list[float]:
    secs = [r[key] for r in result["reps"] if key in r]
    return [result["bytes"] / 1e9 / s for s in secs] if unit == "GB/s" else secs


def _cell(xs: list[float]) -> str:
    if not xs:
        return "-"
    return f"{statistics.median(xs):.2f} [{min(xs):.2f}-{max(xs):.2f}]" if len(xs) > 1 else f"{xs[0]:.2f}"


def targets(result: dict[str, Any]) -> list[str]:
    here = result["cpus"] >= JUDGE_CORES and result["fs_type"] == JUDGE_FS
    med = {key: statistics.median(xs) for _label, key, unit in ROWS if (xs := _figures(result, key, unit))}

    def line(what: str, value: float | None, met: bool, detail: str) -> str:
        if value is None:
            return f"- **not measured** {what}"
        if not here:
            return f"- **not judged here ({result['cpus']} cores, {result['fs_type']})** {what}: {detail}"
        return f"- **{'MET' if met else 'NOT MET'}** {what}: {detail}"

    save, plain_save = med.get("save_cowfs_s"), med.get("save_plain_s")
    load, plain_load = med.get("load_cowfs_s"), med.get("load_plain_s")
    stall, plain_stall = med.get("async_cowfs_stall_s"), med.get("async_plain_stall_s")
    out = [line(f"DCP save by {result['ranks']} ranks >= {SAVE_GBPS:g} GB/s", save,
                save is not None and save >= SAVE_GBPS, f"{save:.2f} GB/s" if save else "")]
    for what, a, b, most, bound in (
            ("DCP save >= 0.8x FileSystemWriter into the plain directory", save, plain_save, False, SAVE_RATIO),
            ("DCP load >= 0.8x FileSystemReader from the plain directory", load, plain_load, False, LOAD_RATIO),
            ("async_save stall <= 1.1x async_save into the plain directory", stall, plain_stall, True, STALL_RATIO)):
        ratio = None if a is None or b is None else a / b
        met = ratio is not None and (ratio <= bound if most else ratio >= bound)
        out.append(line(what, ratio, met, f"{ratio:.2f}x (medians {a:.2f} / {b:.2f})" if ratio is not None else ""))
    return out


def report(result: dict[str, Any]) -> str:
    lines = [f"DCP by {result['ranks']} ranks of one node (issue 34): {result['bytes'] / (1 << 30):.3g} GiB of new "
             f"fp32 tensors per save, {len(result['reps'])} rep(s), arms in turn; {result['fs']}, "
             f"{result['cpus']} CPUs{', cowfs mount --workers ' + str(result['workers']) if result.get('workers') else ''}."
             " GB/s = 1e9 bytes of the state dict over the wall time from a barrier before the call to one after;"
             " figures are median [min-max].", "",
             "| measure | median [min-max] | unit |", "|---|---|---|"]
    for label, key, unit in ROWS:
        xs = _figures(result, key, unit)
        if xs:
            lines.append(f"| {label} | {_cell(xs)} | {unit} |")
    return "\n".join([*lines, "", "#### Issue-34 targets (against this run)", "", *targets(result), ""])
