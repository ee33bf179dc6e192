"""The issue-14 report of the benchmark (tools/bench/compactreport.py) on made-up results:
every target is printed, judged against the bounds of the issue, without a run."""
from __future__ import annotations

from typing import Any

from tools.bench.compactreport import section

MB = 10**6


def _stats(logical: int, stored: int) -> dict[str, Any]:
    return {"logical_bytes": logical, "stored_bytes": stored, "physical_bytes": stored + 256 * MB,
            "stored_ratio": round(stored / logical, 3), "uncompacted_bodies": 0,
            "codecs": {"grouped": {"chunks": 10, "unique_bytes": logical, "stored_bytes": stored}}}


def _reads(**mbps: float) -> dict[str, Any]:
    out: dict[str, Any] = {k: {"bytes": 100 * MB, "seconds": [100 / v, 100 / v]} for k, v in mbps.items()}
    out["caches_dropped"] = True
    return out


def _arm(ratio: float, save_s: float, compact_s: float, idle: bool) -> dict[str, Any]:
    versions = [f"checkpoint-{20 * (i + 1)}" for i in range(10)]
    arm: dict[str, Any] = {
        "save_s": [save_s] * 10, "train_wall_s": 60.0, "info": {"versions": versions},
        "stats_written": _stats(300 * MB, 300 * MB), "stats_compacted": _stats(300 * MB, int(ratio * 300 * MB)),
        "written_compacted": int(ratio * 300 * MB),
        "step": {"compact": {"logical_bytes": 300 * MB, "seconds": compact_s, "deltas": 5, "pieces": 50, "errors": []},
                 "compact_wall_s": compact_s + 0.5, "gc": {"seconds": 0.1}, "gc_wall_s": 0.5},
        "daemon_log": {"runs": [{"files": 3, "bytes": 30 * MB, "pieces": 5, "deltas": 1, "seconds": 0.2}] if idle else [],
                       "problems": []},
        "reads_compacted": _reads(newest=400.0, oldest=300.0),
    }
    if idle:
        arm.update(idle_left=0, idle_wait_s=0.5)
    else:
        arm.update(reads_saved=_reads(newest=420.0), reads_versions=_reads(**{v: 250.0 for v in versions}),
                   identical=True, fsck={"clean": True},
                   peers={"restic": {"tool": "restic 0.14.0", "settings": "v2", "repo_bytes": 270 * MB, "ratio": 0.9},
                          "borg": None})
    return arm


def _results() -> dict[str, Any]:
    plain = _arm(0.6, 0.1, 1.0, False)
    return {"series": [{"workload": "frozen-backbone", "unchanged_resave_new_bytes": 0, "compaction": {
                "stats_before": _stats(700 * MB, 130 * MB), "stats_after": _stats(700 * MB, 100 * MB),
                "step": {"compact": {"logical_bytes": 700 * MB, "seconds": 2.0}, "compact_wall_s": 2.5},
                "resave_new_bytes": 65 * MB, "resave_new_bytes_compacted": 0}}],
            "compaction": {"reps": 1, "read_reps": 2, "checkpoints": 10, "save_steps": 20, "idle": "1s",
                           "trainer": {"bf16": {"off": [_arm(0.44, 0.20, 1.0, False)], "idle": [_arm(0.44, 0.25, 0.0, True)]},
                                       "fp32": {"off": [_arm(0.79, 0.30, 3.0, False)], "idle": [_arm(0.79, 0.30, 0.0, True)]}},
                           "plain": {"bf16": plain}}}


def test_every_issue14_target_is_judged() -> None:
    results = _results()
    md = section(results)
    marks = {t["target"]: t["met"] for t in results["compaction_targets"]}
    assert marks["issue 14: full fine-tune bf16, stored/logical after compact + gc <= 0.45"] is True
    assert marks["issue 14: full fine-tune fp32, stored/logical after compact + gc <= 0.70"] is False
    assert marks["issue 14: durable save with idle compaction within 5% of compaction off, bf16"] is False  # 1.25x
    assert marks["issue 14: durable save with idle compaction within 5% of compaction off, fp32"] is True
    assert marks["issue 14: cold read of the newest within 10% of compaction off, bf16"] is True  # 400 vs 420
    assert marks["issue 14: cold read of the oldest >= 0.5x the newest, bf16"] is True
    assert marks["issue 14: compaction >= 200 MB/s of checkpoint data, bf16"] is True  # 300 MB in 1 s
    assert marks["issue 14: compaction >= 200 MB/s of checkpoint data, fp32"] is False  # 100 MB/s
    assert marks["issue 14: frozen-backbone no worse than today"] is True
    assert marks["issue 14: unchanged re-save adds 0 bytes, before and after compaction"] is True
    assert marks["issue 14: torch.save rewriting one path, bf16 (no bound)"] is None
    assert "restic 0.900, borg not installed" in md  # the peers, side by side
    assert md.count("**NOT MET**") == 3


def test_the_daemons_compaction_log_line_is_what_the_bench_reads(tmp_path) -> None:
    from cowfs.fs.idle_compaction import COMPACTED_LOG
    from tools.bench.compaction import daemon_compactions

    line = "2026-11-23 17:00:00,000 INFO cowfs.compact " + COMPACTED_LOG % (3, 12345, 40, 7, 2, 1.25)
    (tmp_path / "cowfs.log").write_text(line + "\n2026-11-23 17:00:01,000 WARNING cowfs x: trouble\n")
    got = daemon_compactions(tmp_path)
    assert got["runs"] == [{"files": 3, "bytes": 12345, "pieces": 40, "deltas": 7, "regrouped": 2, "seconds": 1.25}]
    assert len(got["problems"]) == 1
