"""A safetensors checkpoint saved through the mount is cut into its tensor pieces as the
kernel's writes arrive (the write-back sends pages a little out of order: they wait in the
reorder window and still reach the layout in order), reads back byte-exact, and a second
save with every tensor moved by a longer header shares every piece."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from cowfs.store import Store
from tests.engine.test_write_layout import compactor_pieces, extents
from tests.support.mountutil import mounted
from tools.harnessutil import run_cowfs


def test_safetensors_saved_through_the_mount_is_pieced(store_path: Path, tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(4)
    sd = {f"h.{i}.w": torch.randn(512, 1024, generator=g) for i in range(4)}
    sd["ln"] = torch.ones(768)
    mnt = tmp_path / "mnt"
    with mounted(store_path, mnt):
        save_file(sd, mnt / "model.safetensors")
        blob = (mnt / "model.safetensors").read_bytes()
        stored = json.loads(run_cowfs("stats", str(mnt), "--json").stdout)["stored_bytes"]
        save_file(sd, mnt / "moved.safetensors", metadata={"note": "x" * 3000})
        moved = (mnt / "moved.safetensors").read_bytes()
        again = json.loads(run_cowfs("stats", str(mnt), "--json").stdout)["stored_bytes"]
    assert len(moved) > len(blob) and moved[-4096:] == blob[-4096:]
    assert again - stored < 64 << 10  # the header and the small tensor: every piece shared
    with Store.open(store_path) as s:
        ino = s.resolve("/model.safetensors").ino
        ends = {e.offset + e.length for e in extents(s, ino)}
        assert {b for _, b in compactor_pieces(blob)} <= ends
        assert s.read_file("/model.safetensors") == blob and s.read_file("/moved.safetensors") == moved
