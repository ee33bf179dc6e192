"""The compacted write-time pieces benchmark (tools/bench/write_layout_series.py) on a short
series: both arms run, the pieced arm's raw pieces are rewritten by compaction while the
content-cut arm's are new, both store about the same after compact + gc, the stores are
removed, and bad arguments get one line."""
from __future__ import annotations

from pathlib import Path

from tools.bench.write_layout import ARMS
from tools.bench.write_layout_series import main, markdown, run


def test_both_arms_store_the_same(tmp_path: Path) -> None:
    runs = run(3, 1, tmp_path, log=lambda _m: None)
    by_arm = {r["arm"]: r for r in runs}
    content, pieced = by_arm[ARMS[0]], by_arm[ARMS[1]]
    assert pieced["rewritten"] > 0 and content["rewritten"] == 0
    assert pieced["deltas"] > 0 and content["deltas"] > 0
    assert abs(pieced["stored_ratio"] - content["stored_ratio"]) < 0.01
    assert "| pieced at write |" in markdown(runs)
    assert not list(tmp_path.iterdir())


def test_bad_arguments(tmp_path: Path, capsys) -> None:
    assert main(["--checkpoints", "1", "--work", str(tmp_path)]) == 2
    assert main(["--work", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("write_layout_series: ") for line in err)
