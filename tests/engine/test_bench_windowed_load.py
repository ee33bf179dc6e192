"""tools/bench/windowed_load.py runs its arms on small checkpoints: each row is there, the
windowed arm really gets several windows, the loads give the state back (the tool checks
it), and the switches are put back."""
from __future__ import annotations

from pathlib import Path

import pytest

from cowfs.plugins import get
from tools.bench.windowed_load import file_loads, loads, state_of


def test_both_arms_run_and_the_windowed_one_gets_windows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    windows: list[int] = []
    real = get._windowed

    def counted(fd, what, wanted, size):  # type: ignore[no-untyped-def]
        windows.append(len(get._windows(wanted)))
        return real(fd, what, wanted, size)

    monkeypatch.setattr(get, "_windowed", counted)
    rows = loads(state_of(8, tensor_mib=1), tmp_path, reps=2, window=3 << 20)
    assert len(rows) == 4 and all(row.startswith("| ") and "[" in row for row in rows), rows
    assert windows and max(windows) >= 3 and get.WINDOW == 1 << 30  # (put back)


def test_the_files_arms_run_and_put_the_switch_back(tmp_path: Path) -> None:
    from cowfs.plugins import dcp_storage

    rows = file_loads(state_of(8, tensor_mib=1), tmp_path, reps=2, files=3)
    assert len(rows) == 4 and "3 files" in rows[0] and dcp_storage.GET_AHEAD is True
