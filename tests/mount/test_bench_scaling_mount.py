"""The scaling part's mount (tools/bench/scaling.py, also used by dcp-ranks): after its files
are removed, its `gc` gives their space back (the history a removal leaves is dropped first:
`cowfs gc` alone keeps it), so stream count after stream count fits one tmpfs."""
from __future__ import annotations

import os
from pathlib import Path

from cowfs.store.upkeep.stats import physical_bytes
from tools.bench.scaling import CowfsMount

MiB = 1 << 20


def test_the_parts_gc_gives_the_space_of_removed_files_back(store_path: Path, tmp_path: Path) -> None:
    mount = CowfsMount(store_path, tmp_path / "mnt", None)
    mount.mount()
    try:
        for i in range(3):  # 48 MiB: three of the store's 16 MiB segments and more
            (mount.mnt / f"f{i}").write_bytes(os.urandom(16 * MiB))
        full = physical_bytes(store_path)
        for i in range(3):
            (mount.mnt / f"f{i}").unlink()
        mount.gc()
        assert physical_bytes(store_path) < full - 32 * MiB
    finally:
        mount.unmount()
