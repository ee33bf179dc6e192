"""The dcp-ranks part's launcher (tools/bench/dcp_ranks.py) without a mount: a launch whose
ranks fail says which rank failed and why, and leaves no rank process behind."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from tools.bench.dcp_ranks import _launch


def _children() -> set[int]:
    me = os.getpid()
    out = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == me:
                        out.add(int(entry))
            except (OSError, ValueError, IndexError):
                continue
    return out


def test_a_failed_launch_names_the_rank_and_leaves_no_process(tmp_path: Path) -> None:
    (tmp_path / "plain").mkdir()
    before = _children()
    with pytest.raises(RuntimeError, match=r"dcp-ranks: rank \d of 2 exited .*\(load\)"):
        _launch(tmp_path, 2, 1 << 20, 0, "load", ["plain"], [])  # nothing was saved: every rank fails
    assert _children() <= before


def test_every_arm_saves_bytes_of_its_own_and_loads_them_back(tmp_path: Path) -> None:
    """Two save arms of one rep write different bytes (a cowfs arm after another would
    otherwise find every chunk stored already), and each load checks its own arm's bytes.
    Without a mount, "fuse" is FileSystemWriter into a plain directory too."""
    (tmp_path / "plain").mkdir()
    (tmp_path / "mnt" / "dcp").mkdir(parents=True)
    row = _launch(tmp_path, 2, 1 << 20, 0, "save", ["plain", "fuse"], [])
    assert set(row) == {"save_plain_s", "save_fuse_s"}
    for rank in range(2):
        plain = (tmp_path / "plain" / "save-plain-0" / f"__{rank}_0.distcp").read_bytes()
        fuse = (tmp_path / "mnt" / "dcp" / "save-fuse-0" / f"__{rank}_0.distcp").read_bytes()
        assert len(plain) == len(fuse) > 1 << 19
        assert plain != fuse
    assert set(_launch(tmp_path, 2, 1 << 20, 0, "load", ["fuse", "plain"], [])) == {"load_fuse_s", "load_plain_s"}
