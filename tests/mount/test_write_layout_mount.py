"""A safetensors checkpoint saved through the mount is cut into its tensor pieces as the
kernel's writes arrive (the write-back sends pages a little out of order: they wait in the
reorder window and still reach the layout in order), reads back byte-exact, and a second
save with every tensor moved by a longer header shares every piece. So is a torch.save
archive (its storages' entries walked as they come), with and without the writeback cache."""
from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from cowfs.store import Store
from tests.support.layoututil import compactor_pieces, extents
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
        assert {b for _, b in compactor_pieces(blob, "model.safetensors")} <= ends
        assert s.read_file("/model.safetensors") == blob and s.read_file("/moved.safetensors") == moved


@pytest.mark.parametrize("extra", [(), ("--writeback-cache",)])
def test_torch_save_through_the_mount_is_pieced(store_path: Path, tmp_path: Path, extra: tuple[str, ...]) -> None:
    g = torch.Generator().manual_seed(5)
    model = {f"h.{i}.w": torch.randn(512, 1024, generator=g) for i in range(3)}
    optim = {"state": {i: {"exp_avg": torch.randn(512, 1024, generator=g).bfloat16()} for i in range(3)},
             "param_groups": [{"lr": 1e-4, "params": [0, 1, 2]}]}
    with mounted(store_path, tmp_path / "mnt", *extra) as mnt:
        torch.save(model, mnt / "model.pt")
        torch.save(optim, mnt / "optimizer.pt")
    with Store.open(store_path) as s:
        for name in ("model.pt", "optimizer.pt"):
            blob = s.read_file(f"/{name}")
            want = compactor_pieces(blob, name)
            assert len(want) == 3 * (2 if name == "model.pt" else 1)
            ends = {e.offset + e.length for e in extents(s, s.resolve(f"/{name}").ino)}
            assert {b for _, b in want} <= ends and {a for a, _ in want} <= ends, name
        back = torch.load(io.BytesIO(s.read_file("/model.pt")), weights_only=True)
        assert all(torch.equal(back[k], model[k]) for k in model)
        back = torch.load(io.BytesIO(s.read_file("/optimizer.pt")), weights_only=True)
        assert torch.equal(back["state"][2]["exp_avg"], optim["state"][2]["exp_avg"])
