"""cowfs.dcp (issue 34): torch.distributed.checkpoint through the bulk socket, ranks in
processes of a gloo group (tests/support/dcp_ranks.py). The files are those a save through
the mount makes, byte for byte and chunk for chunk; both readers load them bitwise; a rank
killed mid-save leaves the checkpoint without .metadata and the one before whole."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from cowfs.store import Store
from tests.support import ranks
from tests.support.mountutil import mounted

pytestmark = pytest.mark.mount


def run_ranks(world: int, tmp_path: Path, mnt: Path, step: int, mode: str) -> list[int]:
    rendezvous = tmp_path / f"rendezvous-{step}-{mode}"
    return ranks.run_ranks("tests.support.dcp_ranks", [[str(r), str(world), str(rendezvous), str(mnt), str(step), mode]
                                                        for r in range(world)], quiet=mode == "die")


def _chunks(store: Store, path: str) -> list[bytes]:
    with store.open_reader(store.resolve(path).ino) as r:
        return [e.chunk for e in r.extents]


def test_dcp_writer_and_reader_with_ranks(store_path: Path, tmp_path: Path) -> None:
    with mounted(store_path, tmp_path / "m") as mnt:
        assert run_ranks(2, tmp_path, mnt, 5, "save") == [0, 0]
        ours, stock = mnt / "dcp" / "step-5", mnt / "dcp" / "stock-5"
        names = sorted(os.listdir(ours))
        assert names == sorted(os.listdir(stock)) == [".metadata", "__0_0.distcp", "__1_0.distcp"], names
        for name in names[1:]:
            assert (ours / name).read_bytes() == (stock / name).read_bytes(), name
        assert sorted(os.listdir(mnt / "dcp" / "step-6")) == [".metadata", "__0_0.distcp", "__0_1.distcp",
                                                                "__1_0.distcp", "__1_1.distcp"]
    with Store.open(store_path) as s:
        for name in names[1:]:
            assert _chunks(s, f"/dcp/step-5/{name}") == _chunks(s, f"/dcp/stock-5/{name}"), name


@pytest.mark.long
def test_a_rank_killed_mid_save_leaves_no_complete_checkpoint(store_path: Path, tmp_path: Path) -> None:
    with mounted(store_path, tmp_path / "m") as mnt:
        assert run_ranks(2, tmp_path, mnt, 1, "save") == [0, 0]
        codes = run_ranks(2, tmp_path, mnt, 3, "die")
        assert codes[1] == -9 and codes[0] not in (0, 3), codes
        # rank 1 died while writing its file, before any put of it: rank 0's file is whole,
        # rank 1's never appeared (nor an empty one), and without .metadata nothing reads step-3
        assert sorted(os.listdir(mnt / "dcp" / "step-3")) == ["__0_0.distcp"]
        assert run_ranks(2, tmp_path, mnt, 1, "load") == [0, 0]  # the checkpoints before load whole
