"""tools/bench/fdelta_decode.py: both arms decode in their own processes (the second from
another source tree given by --code), the table has a row per arm, format and codec, and
bad arguments are one-line errors."""
from __future__ import annotations

from pathlib import Path

import pytest

from tools.bench.docs import REPO
from tools.bench.fdelta_decode import main
from tools.harnessutil import run_in_tree


def test_two_arms_make_a_row_per_arm_format_and_codec(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--elements", "5000", "--reps", "2", "--timings", "2", "--code", str(REPO)]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith(f"| {REPO} |")]
    one = [f"{f} {c}" for f in ("bf16", "f32") for c in ("4", "5 plain", "5")]
    assert [r.split(" | ")[1] for r in rows] == one + one
    for r in rows:
        speeds = r.split(" | ")[3].split(" / ")
        assert len(speeds) == 2 and all(float(v) > 0 for v in speeds)


def test_bad_arguments(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--reps", "0"])
    with pytest.raises(SystemExit):
        main(["--code", str(tmp_path)])
    assert "no cowfs/ there" in capsys.readouterr().err


def test_an_arm_runs_the_given_trees_cowfs_and_a_failing_one_is_one_line(tmp_path: Path) -> None:
    assert run_in_tree(REPO, "import cowfs, sys; print(cowfs.__file__, sys.argv[1])", "x").split() == [
        str(REPO / "cowfs" / "__init__.py"), "x"]
    with pytest.raises(SystemExit, match=f"the arm in {tmp_path} failed: .*ZeroDivisionError"):
        run_in_tree(tmp_path, "1 / 0")
