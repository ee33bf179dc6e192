"""tools/bench/plugins.py's report: ratios of medians over every rep, targets met or not."""
from __future__ import annotations

from tools.bench.plugins import TARGETS, report


def _rep(**over: float) -> dict[str, float]:
    rep = {key: 1.0 for _what, num, den, _most in TARGETS for key in (num, den)}
    rep.update(over)
    return rep


def test_report_gives_each_rep_the_median_ratio_and_the_verdict() -> None:
    reps = [_rep(background_stall_s=s, torch_save_page_cache_s=1.0, background_durable_s=d, fdatasync_s=1.0)
            for s, d in ((1.0, 2.0), (1.05, 1.3), (9.0, 1.1))]
    out = report({"mib": 256, "reps": reps, "cold": True})
    stall = next(line for line in out.splitlines() if line.startswith("| background save: stall"))
    durable = next(line for line in out.splitlines() if line.startswith("| background save: durable"))
    assert "1.00 / 1.05 / 9.00" in stall and "| 1.05 |" in stall and "met" in stall and "not met" not in stall
    assert "| 1.30 |" in durable and "not met" in durable
    assert "3 reps, cold reads: True" in out
