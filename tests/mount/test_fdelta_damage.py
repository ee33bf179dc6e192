"""Issue 36: a float delta (codec 4) read through the mount. Three bf16 safetensors
checkpoints, compacted: the older two hold their weights as float deltas against the next
newer one (their context pieces). Damage to a context piece fails with EIO every file that
decodes through it, damage to a delta fails its own file alone, every other file reads
byte-exact, and `cowfs fsck` names exactly the failing files."""
from __future__ import annotations

import errno
import json
import sqlite3
from pathlib import Path

import pytest
import torch
from safetensors.torch import save

from cowfs.store import Store
from cowfs.store.log.layout import CATALOG_FILE, segment_path
from cowfs.store.log.records import CODEC_FDELTA32
from tests.support.mountutil import mounted
from tools.harnessutil import run_cowfs

pytestmark = pytest.mark.mount


def build(path: Path) -> dict[str, bytes]:
    g = torch.Generator().manual_seed(36)
    w = {"layer.weight": torch.randn(512, 1024, generator=g) * 0.02}
    files = {}
    Store.init(path, segment_size=16 << 20)
    with Store.open(path) as s:
        for i in range(3):
            w = {k: v - 1e-3 * torch.randn(v.shape, generator=g) for k, v in w.items()}
            s.mkdir(1, f"checkpoint-{i}".encode())
            files[f"checkpoint-{i}/model.safetensors"] = data = save({k: v.to(torch.bfloat16) for k, v in w.items()})
            s.write_file(f"/checkpoint-{i}/model.safetensors", data)
            files[f"checkpoint-{i}/notes.txt"] = note = f"step {i}\n".encode()
            s.write_file(f"/checkpoint-{i}/notes.txt", note)
        s.compact()
        s.gc()
    return files


def fdelta_chain(path: Path) -> list[tuple[int, int, int, int | None]]:
    """(cid, segment, offset, base cid) of the first piece's records, oldest first."""
    conn = sqlite3.connect(path / CATALOG_FILE)
    try:
        rows = {cid: (seg, off, base, codec) for cid, seg, off, base, codec in
                conn.execute("SELECT cid, seg_id, offset, base_cid, codec FROM chunks")}
    finally:
        conn.close()
    older = [c for c, (_s, _o, base, codec) in rows.items() if codec == CODEC_FDELTA32 and base is not None]
    assert older, "no float deltas were written"
    based = {rows[c][2] for c in older}
    start = next(c for c in older if c not in based)  # a delta nothing leans on: the oldest
    chain = []
    cid: int | None = start
    while cid is not None:
        seg, off, base, _codec = rows[cid]
        chain.append((cid, seg, off, base))
        cid = base
    return chain


def damage(path: Path, seg: int, off: int) -> None:
    with open(segment_path(path, seg), "r+b") as f:
        f.seek(off + 64 + 200)  # inside the payload, past the base id and the codec's header
        f.write(b"\x5a" * 32)


def reads(mnt: Path, files: dict[str, bytes]) -> set[str]:
    """The files that fail with EIO; every other one must read byte-exact."""
    failed = set()
    for name, data in files.items():
        try:
            assert (mnt / name).read_bytes() == data, name
        except OSError as e:
            assert e.errno == errno.EIO, (name, e)
            failed.add(name)
    return failed


def fsck_names(path: Path, files: dict[str, bytes]) -> set[str]:
    """The files `cowfs fsck` names in its problem lines."""
    r = run_cowfs("fsck", str(path), "--json", check=False)
    assert r.returncode == 1, r.stdout
    text = "\n".join(json.loads(r.stdout)["problems"])
    return {name for name in files if f"/{name}" in text}


@pytest.mark.parametrize("target", ["context", "delta"])
def test_damage_fails_exactly_the_files_that_decode_through_it(tmp_path: Path, target: str) -> None:
    store = tmp_path / "store"
    files = build(store)
    chain = fdelta_chain(store)  # checkpoint-0's piece -> checkpoint-1's -> checkpoint-2's (whole)
    assert len(chain) == 3
    if target == "context":  # checkpoint-1's piece: checkpoint-0 decodes through it
        _cid, seg, off, _base = chain[1]
        expected = {"checkpoint-0/model.safetensors", "checkpoint-1/model.safetensors"}
    else:  # checkpoint-0's own delta
        _cid, seg, off, _base = chain[0]
        expected = {"checkpoint-0/model.safetensors"}
    damage(store, seg, off)
    with mounted(store, tmp_path / "mnt") as mnt:
        assert reads(mnt, files) == expected
    assert fsck_names(store, files) == expected
