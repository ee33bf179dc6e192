"""The issue-15 report of the benchmark (tools/bench/datapathreport.py) on made-up results:
ratios per pair, CPU per GiB by thread, every target judged, and the projection's arithmetic."""
from __future__ import annotations

from typing import Any

from tools.bench.datapath import GIB
from tools.bench.datapathreport import projection, section, summarize, targets

MIB = 1 << 20


def _w(cowfs: list[float], disk: list[float], nbytes: int, trio: float, daemon: float) -> dict[str, Any]:
    return {"cowfs_s": cowfs, "disk_s": disk, "trio_cpu_s": [trio] * len(cowfs), "daemon_cpu_s": [daemon] * len(cowfs),
            "bytes": nbytes}


def _results() -> dict[str, Any]:
    q = GIB // 4  # 256 MiB: CPU seconds per GiB are 4x the per-run figures
    return {"datapath": {"size": q, "small_files": 2000, "reps": 3, "cpus": 2, "workloads": {
        "save-torch": _w([1.2, 1.0, 1.1], [1.0, 1.0, 1.0], q, 0.05, 0.3),
        "save-safetensors": _w([0.9, 0.9, 0.9], [1.0, 1.0, 1.0], q, 0.05, 0.3),
        "write-dd": _w([0.5, 0.5, 0.5], [0.4, 0.4, 0.4], q, 0.05, 0.3),
        "write-cp": _w([1.0, 1.0, 1.0], [0.4, 0.4, 0.4], q, 0.25, 0.5),
        "read-cat": _w([0.4, 0.4, 0.4], [0.3, 0.3, 0.3], q, 0.05, 0.2),
        "read-torch": _w([0.3, 0.3, 0.3], [0.3, 0.3, 0.3], q, 0.05, 0.2),
        "read-safetensors": _w([0.3, 0.3, 0.3], [0.3, 0.3, 0.3], q, 0.05, 0.2),
        "read-safe-open": _w([0.3, 0.3, 0.3], [0.3, 0.3, 0.3], q, 0.05, 0.2),
        "small-files": _w([0.8, 1.0, 1.2], [0.1, 0.1, 0.1], 2000 * 4096, 0.5, 0.7),
    }}}


def test_ratios_and_cpu_per_gib() -> None:
    s = summarize(_results()["datapath"])
    assert s["save-torch"]["time_ratio"] == 1.1 and s["save-torch"]["time_ratio_range"] == (1.0, 1.2)
    assert s["write-dd"]["speed_ratio"] == 0.8
    assert abs(s["write-cp"]["trio_s_per_gib"] - 1.0) < 1e-9 and abs(s["write-cp"]["daemon_s_per_gib"] - 2.0) < 1e-9
    assert abs(s["write-cp"]["workers_s_per_gib"] - 1.0) < 1e-9
    assert s["small-files"]["cowfs_per_s"] == 2000


def test_every_target_is_judged() -> None:
    got = {t["target"]: t["met"] for t in targets(summarize(_results()["datapath"]))}
    assert got["issue 15: durable torch.save <= 1.0x the safe pattern"] is False
    assert got["issue 15: save_file + fsync <= 1.0x the disk"] is True
    assert got["issue 15: dd bs=4M conv=fsync >= 0.8x the disk"] is True  # exactly the bound
    assert got["issue 15: cp + fsync >= 0.8x the disk"] is False
    assert got["issue 15: cat, cold >= 0.8x the disk"] is False
    assert got["issue 15: torch.load, cold >= 0.8x the disk"] is True
    assert got["issue 15: trio thread <= 0.25 CPU s per GiB written"] is False  # cp: 1.0
    assert got["issue 15: whole daemon <= 1.5 CPU s per GiB written"] is False  # cp: 2.0
    assert got["issue 15: trio thread <= 0.25 CPU s per GiB read"] is True  # 0.2
    assert got["issue 15: >= 2,000 small files per second"] is True
    assert len(got) == 12


def test_projection_is_bounded_by_the_serial_part() -> None:
    s = {"trio_s_per_gib": 0.5, "daemon_s_per_gib": 4.0}
    per = GIB / 1e9
    assert abs(projection(s, 2) - 2 * per / 4.0) < 1e-9  # all cores busy first
    assert abs(projection(s, 128) - per / 0.5) < 1e-9  # then the trio thread alone
    md = section(_results())
    assert "**Projection** (not a measurement)" in md and md.count("NOT MET") == 5
