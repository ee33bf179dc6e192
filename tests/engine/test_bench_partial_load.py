"""tools/bench/partial_load.py runs its three arms on a small checkpoint, each load checked
against the model saved (the tool asserts it), and prints a row per arm and measure."""
from __future__ import annotations

from pathlib import Path

from tools.bench.partial_load import ARMS, checkpoint, loads


def test_each_arm_runs_and_gives_the_model_back(tmp_path: Path) -> None:
    model, optim = checkpoint(2)
    rows = loads(model, optim, tmp_path, reps=1)
    assert len(rows) == 2 * len(ARMS) and all(row.startswith("| ") and "[" in row for row in rows), rows
    assert any("ranges" in row for row in rows)
