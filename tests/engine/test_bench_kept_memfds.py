"""tools/bench/kept_memfds.py runs its arms on a small state: every row is there, and its DCP
loads through both kinds of get give back the state (the tool checks it)."""
from __future__ import annotations

from pathlib import Path

import torch

from tools.bench.kept_memfds import dcp_loads, saves


def test_each_arm_runs_and_the_loads_give_the_state_back(tmp_path: Path) -> None:
    state = {f"t{i}": torch.randn(1 << 14) for i in range(4)}
    rows = saves(state, tmp_path, reps=2) + dcp_loads(state, tmp_path, reps=2)
    assert len(rows) == 7 and all(row.startswith("| ") and "[" in row for row in rows), rows
    assert any("kept memfd" in row for row in rows)
