"""tools/bench/session_stream.py: each arm writes and commits in its own process (the second
from another source tree given by --code), the table has a row per arm with its speed against
the first arm's, and bad arguments are one-line errors."""
from __future__ import annotations

from pathlib import Path

import pytest

from tools.bench.docs import REPO
from tools.bench.session_stream import main, table


def test_two_arms_make_a_row_each(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--mib", "24", "--reps", "2", "--work", str(tmp_path), "--code", str(REPO)]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith(f"| {REPO} |")]
    assert len(rows) == 2
    for r in rows:
        cells = r.split(" | ")
        assert float(cells[1].split()[0]) > 0 and float(cells[2].split()[0]) > 0
    assert rows[0].endswith("| 1.00 |")  # the first arm against itself
    assert list(tmp_path.iterdir()) == []  # each arm's store is gone


def test_streams_at_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--mib", "24", "--streams", "3", "--reps", "1", "--work", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "3 write streams at once" in out
    assert len([line for line in out.splitlines() if line.startswith(f"| {REPO} |")]) == 1
    assert list(tmp_path.iterdir()) == []


def test_the_ratio_is_per_repetition() -> None:
    runs = [[{"gib_s": 1.0, "cpu_s_per_gib": 2.0}, {"gib_s": 2.0, "cpu_s_per_gib": 2.0}],
            [{"gib_s": 1.5, "cpu_s_per_gib": 1.0}, {"gib_s": 2.0, "cpu_s_per_gib": 3.0}]]
    rows = table([Path("a"), Path("b")], runs)
    assert rows[2] == "| a | 1.50 [1.00-2.00] | 2.00 [2.00-2.00] | 1.00 |"
    assert rows[3] == "| b | 1.75 [1.50-2.00] | 2.00 [1.00-3.00] | 1.25 |"  # median of 1.5 and 1.0


def test_bad_arguments(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--reps", "0"])
    with pytest.raises(SystemExit):
        main(["--work", str(tmp_path / "missing")])
    with pytest.raises(SystemExit):
        main(["--streams", "0"])
    with pytest.raises(SystemExit):
        main(["--mib", "2", "--streams", "4", "--work", str(tmp_path)])
    with pytest.raises(SystemExit):
        main(["--code", str(tmp_path)])
    err = capsys.readouterr().err
    assert "no cowfs/ there" in err and "at least 1 MiB per stream" in err
