"""The dcp-ranks part's report on made-up runs (tools/bench/dcpreport.py): GB/s per arm from
seconds, and the issue-34 targets judged only on a 16-core machine with the store in RAM."""
from __future__ import annotations

from typing import Any

from tools.bench.dcpreport import report, targets

GIB = 1 << 30


def _result(cpus: int, fs_type: str, cowfs_save_s: float) -> dict[str, Any]:
    reps = [{"save_cowfs_s": cowfs_save_s + 0.1 * k, "save_plain_s": 1.0, "save_fuse_s": 10.0,
             "load_cowfs_s": 1.0, "load_plain_s": 0.5, "load_fuse_s": 4.0,
             "async_cowfs_stall_s": 0.5, "async_plain_stall_s": 0.5 + 0.05 * k,
             "async_cowfs_done_s": 2.0, "async_plain_done_s": 1.0} for k in range(3)]
    return {"fs": f"{fs_type} on x (/w)", "fs_type": fs_type, "cpus": cpus, "ranks": 8, "bytes": 8 * GIB,
            "workers": 16, "reps": reps}


def test_targets_met_and_not_met_on_the_judged_machine() -> None:
    lines = targets(_result(16, "tmpfs", 1.0))
    assert lines[0] == "- **MET** DCP save by 8 ranks >= 5 GB/s: 7.81 GB/s"  # 8 GiB in 1.1 s (the median rep)
    assert lines[1].startswith("- **MET** DCP save >= 0.8x") and "0.91x" in lines[1]
    assert lines[2].startswith("- **NOT MET** DCP load >= 0.8x") and "0.50x" in lines[2]
    assert lines[3].startswith("- **MET** async_save stall <= 1.1x") and "0.91x" in lines[3]
    slow = targets(_result(16, "tmpfs", 3.0))
    assert slow[0].startswith("- **NOT MET** DCP save by 8 ranks") and slow[1].startswith("- **NOT MET**")


def test_not_judged_off_the_machine_and_the_table() -> None:
    md = report(_result(2, "ext4", 1.0))
    assert md.count("not judged here (2 cores, ext4)") == 4 and "**MET**" not in md
    assert "| dcp.save, cowfs.dcp.Writer | 7.81 [7.16-8.59] | GB/s |" in md
    assert "| async_save stall, cowfs.dcp.Writer | 0.50 [0.50-0.50] | s |" in md
    partial = _result(16, "tmpfs", 1.0)
    for r in partial["reps"]:
        del r["async_cowfs_stall_s"]
    assert targets(partial)[3] == "- **not measured** async_save stall <= 1.1x async_save into the plain directory"
