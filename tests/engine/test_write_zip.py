"""torch.save archives, .distcp files and .npy arrays cut into their pieces as they are written
(tensors/write_zip.py, write_layout.py): fed batch by batch as a write session feeds them,
through the real chunker with the holds it is asked for, the layout learns exactly the
compactor's pieces, whatever the batch sizes, and the chunks end at every piece. Hostile or
cut-short archives give fewer regions, never an error. Every store is fsck'ed at teardown."""
from __future__ import annotations

import io
import random
import struct

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cowfs.store import ROOT_INO, Store
from cowfs.store.tensors.write_zip import ZipWalk
from tests.support.layoututil import compactor_pieces, extents, fed, learnt

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.uint8, torch.float64]


def state_dict(rng: random.Random, n: int) -> dict[str, object]:
    out: dict[str, object] = {}
    for i in range(n):
        dtype = rng.choice(DTYPES)
        numel = rng.choice([0, 1, 100, 3000, rng.randrange(2000, 400_000)])
        t = torch.frombuffer(bytearray(rng.randbytes(numel * dtype.itemsize)), dtype=dtype) if numel else torch.zeros(0)
        out[f"layer.{i}.w"] = t
        if rng.random() < 0.2 and numel > 10:
            out[f"layer.{i}.view"] = t[5:]  # a second view of one storage
    if rng.random() < 0.5:  # an optimizer's state: nested dicts, ints, floats
        out["optim"] = {"state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.ones(rng.randrange(1, 50_000))}},
                        "param_groups": [{"lr": 1e-3, "params": [0]}]}
    return out


def saved(obj: object) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(0, 6),
       sizes=st.lists(st.sampled_from([1, 7, 64, 100, 4096, 65_536, 300_000, 8 << 20]), min_size=1, max_size=4))
def test_torch_save_regions_are_the_compactors_pieces(seed: int, n: int, sizes: list[int]) -> None:
    blob = saved(state_dict(random.Random(seed), n))
    layout, ends = fed(blob, sizes + [1 << 20])  # small batches at any place, but not only those
    want = compactor_pieces(blob, "x.pt")
    assert learnt(layout) == want
    assert {b for _, b in want} <= ends and {a for a, _ in want} <= ends | {0}


def test_distcp_regions_are_the_compactors_pieces(tmp_path) -> None:
    import torch.distributed.checkpoint as dcp

    rng = random.Random(5)
    sd = {f"w{i}": torch.frombuffer(bytearray(rng.randbytes(4 * k)), dtype=torch.float32)
          for i, k in enumerate([300_000, 5, 700_000, 2000])}
    sd["meta"] = {"step": 7, "note": "x" * 3000}  # a bytes item between the tensors
    dcp.save(sd, checkpoint_id=str(tmp_path / "ckpt"), no_dist=True)
    blob = next((tmp_path / "ckpt").glob("*.distcp")).read_bytes()
    want = compactor_pieces(blob, "__0_0.distcp")
    assert len(want) >= 4
    for sizes in ([8 << 20], [1 << 20], [4096, 100], [333_333]):
        layout, ends = fed(blob, sizes)
        assert learnt(layout) == want, sizes
        assert {b for _, b in want} <= ends


@pytest.mark.parametrize("dtype,fortran", [(np.float32, False), (np.int16, True), (np.uint8, False)])
def test_npy_region_is_the_compactors(dtype, fortran) -> None:
    arr = np.arange(700_000, dtype=dtype).reshape(700, 1000)
    buf = io.BytesIO()
    np.save(buf, np.asfortranarray(arr) if fortran else arr)
    blob = buf.getvalue()
    layout, ends = fed(blob, [1 << 20])
    want = compactor_pieces(blob, "x.npy")
    assert learnt(layout) == want and want
    assert {b for _, b in want} <= ends


def _descriptor_at(blob: bytes, entry: str) -> int:
    """Offset of the data descriptor after entry `entry` of a torch.save archive."""
    name = entry.encode()
    at = blob.index(name) - 30
    sig, _v, _f, _m, _t, _d, _c, _cs, _us, nlen, elen = struct.unpack_from("<4sHHHHHIIIHH", blob, at)
    data = at + 30 + nlen + elen
    return blob.index(b"PK\x07\x08", data)


def test_hostile_and_cut_short_archives_give_fewer_regions_never_an_error() -> None:
    rng = random.Random(9)
    blob = saved({f"t{i}": torch.frombuffer(bytearray(rng.randbytes(4 * 300_000)), dtype=torch.float32)
                  for i in range(4)})
    full = learnt(fed(blob, [1 << 20])[0])
    assert len(full) == 4 * 2  # 1.2 MB each: two pieces
    bad_descriptor = bytearray(blob)
    d = _descriptor_at(blob, "archive/data/1")
    bad_descriptor[d + 8:d + 12] = b"\xff\xff\xff\x7f"  # its size says otherwise: the walk ends there
    bad_pickle = bytearray(blob)
    p = blob.index(b"archive/data.pkl") + len("archive/data.pkl")
    bad_pickle[p + 40:p + 60] = rng.randbytes(20)
    cases = {
        "cut short": (blob[:len(blob) // 2], lambda got: got == full[:len(got)]),
        "bad descriptor": (bytes(bad_descriptor), lambda got: got == full[:4]),
        "bad pickle": (bytes(bad_pickle), lambda got: got in ([], full)),
        "random after a local header": (blob[:60] + rng.randbytes(3 << 20), lambda got: got == []),
        "a header alone": (blob[:20], lambda got: got == []),
    }
    for name, (data, ok) in cases.items():
        for sizes in ([1 << 20], [100, 5000]):
            got = learnt(fed(data, sizes)[0])
            assert ok(got), (name, sizes, got)


def test_the_walk_holds_where_a_record_is_not_whole() -> None:
    blob = saved({"w": torch.zeros(300_000)})
    walk = ZipWalk()
    found, hold = walk.advance(20, lambda o, n: blob[o:min(o + n, 20)], final=False)
    assert (found, hold) == ([], 0)  # the first local header is not whole
    found, hold = walk.advance(len(blob), lambda o, n: blob[o:o + n], final=True)
    assert len(found) == 1 and hold is None and found[0].length == 1_200_000


def test_a_torch_save_through_a_session_is_cut_at_its_pieces(store: Store) -> None:
    rng = random.Random(4)
    sd = {f"t{i}": torch.frombuffer(bytearray(rng.randbytes(4 * k)), dtype=torch.float32)
          for i, k in enumerate([600_000, 1_500_000, 3, 1_000_000])}
    blob = saved(sd)
    ino = store.create(ROOT_INO, b"a.pt").ino
    with store.open_session(ino) as s:
        for pos in range(0, len(blob), 1 << 20):
            s.write(pos, blob[pos:pos + (1 << 20)])
        assert s.streaming
        s.commit()
    ends = {e.offset + e.length for e in extents(store, ino)}
    want = compactor_pieces(blob, "a.pt")
    assert {b for _, b in want} <= ends and {a for a, _ in want} <= ends
    assert store.read_file("/a.pt") == blob


def test_many_small_archives_back_to_back() -> None:
    """A .distcp file of many small items (each a torch.save of its own, its pickle read from
    the bytes near it, not the rest of the batch): every tensor is found."""
    blob = b"".join(saved(torch.full((1500,), float(i))) for i in range(300))
    layout, ends = fed(blob, [8 << 20])
    want = compactor_pieces(blob, "__0_0.distcp")
    assert len(want) == 300 and learnt(layout) == want
