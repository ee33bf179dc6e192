"""tools/bench/log_appends.py: each arm appends from T threads in its own process (the second
from another source tree given by --code), a row per thread count and arm with its speed
against the first arm's, and bad arguments are one-line errors."""
from __future__ import annotations

from pathlib import Path

import pytest

from tools.bench.docs import REPO
from tools.bench.log_appends import main, table


def test_two_arms_and_two_thread_counts_make_a_row_each(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--gib", "0.0625", "--threads", "1", "2", "--reps", "1", "--work", str(tmp_path),
                 "--code", str(REPO)]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if f"| {REPO} |" in line]
    assert [r.split(" | ")[0] for r in rows] == ["| 1", "| 1", "| 2", "| 2"]
    for r in rows:
        cells = r.split(" | ")
        assert float(cells[2].split()[0]) > 0 and float(cells[3].split()[0]) > 0
    assert rows[0].endswith("| 1.00 |") and rows[2].endswith("| 1.00 |")
    assert list(tmp_path.iterdir()) == []  # each arm's store is gone


def test_the_ratio_is_per_repetition_and_thread_count() -> None:
    runs = {(0, 2): [{"gib_s": 1.0, "cpu_s_per_gib": 0.5}, {"gib_s": 2.0, "cpu_s_per_gib": 0.7}],
            (1, 2): [{"gib_s": 3.0, "cpu_s_per_gib": 0.6}, {"gib_s": 2.0, "cpu_s_per_gib": 0.6}]}
    rows = table([Path("a"), Path("b")], [2], runs)
    assert rows[2] == "| 2 | a | 1.50 [1.00-2.00] | 0.60 [0.50-0.70] | 1.00 |"
    assert rows[3] == "| 2 | b | 2.50 [2.00-3.00] | 0.60 [0.60-0.60] | 2.00 |"  # median of 3.0 and 1.0


def test_bad_arguments(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for bad in (["--reps", "0"], ["--threads", "0"], ["--gib", "0.001", "--work", str(tmp_path)],
                ["--work", str(tmp_path / "missing")], ["--code", str(tmp_path), "--work", str(tmp_path)]):
        with pytest.raises(SystemExit):
            main(bad)
    err = capsys.readouterr().err
    assert "at least one 8 MiB batch per thread" in err and "no cowfs/ there" in err and "not a directory" in err
