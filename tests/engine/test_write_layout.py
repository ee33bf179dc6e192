"""Tensor files cut into their pieces as they are written (tensors/write_layout.py, the
session's `_tensor_regions`, the chunker's fixed regions): the regions learnt from a
safetensors header are the compactor's pieces; anything else is cut by content as before;
a store's chunks of a safetensors file end at every piece boundary, and the same tensors
written at other offsets share their chunks. Every store is fsck'ed at teardown."""
from __future__ import annotations

import json
import random
import struct

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.numpy import save as save_numpy

from cowfs.store import ROOT_INO, Store
from cowfs.store.data.chunking import stream_reader
from cowfs.store.data.session import BATCH
from cowfs.store.tensors.pieces import MIN_TENSOR_BYTES
from cowfs.store.tensors.write_layout import WriteLayout
from tests.support.layoututil import compactor_pieces as support_compactor_pieces
from tests.support.layoututil import extents, fed, learnt

DTYPES = [np.float32, np.float16, np.int64, np.uint8, np.float64]


def state_dict(rng: random.Random, n: int) -> dict[str, np.ndarray]:
    out = {}
    for i in range(n):
        dtype = rng.choice(DTYPES)
        numel = rng.choice([0, 1, 100, 1000, rng.randrange(2000, 700_000)])
        out[f"layer.{i}.w"] = np.frombuffer(rng.randbytes(numel * np.dtype(dtype).itemsize), dtype=dtype)
    return out


def compactor_pieces(blob: bytes) -> list[tuple[int, int]]:
    return support_compactor_pieces(blob, "x.safetensors")


def learnt_pieces(blob: bytes, first_batch: int) -> list[tuple[int, int]]:
    layout = WriteLayout()
    end = min(first_batch, len(blob))
    layout.learn(0, end, stream_reader([blob[:end // 2], blob[end // 2:end]], 0), final=end == len(blob))
    layout.learn(end, len(blob), stream_reader([blob[end:]], end), final=True)  # later batches add nothing
    out = []
    for start, stop, step in layout.regions(0, len(blob)):
        out += [(o, min(o + step, stop)) for o in range(start, stop, step)]
    return out


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(0, 8), meta=st.booleans())
def test_safetensors_regions_are_the_compactors_pieces(seed: int, n: int, meta: bool) -> None:
    rng = random.Random(seed)
    blob = save_numpy(state_dict(rng, n), metadata={"format": "np"} if meta else None)
    assert learnt_pieces(blob, BATCH) == compactor_pieces(blob)
    layout = WriteLayout()
    layout.learn(0, len(blob), stream_reader([blob], 0), final=True)
    for _ in range(20):  # a batch's regions: those that reach into it
        a = rng.randrange(len(blob) + 1)
        b = rng.randrange(a, len(blob) + 2)
        assert layout.regions(a, b) == [r for r in layout.known if r[1] > a and r[0] < b]


def test_what_is_not_learnt() -> None:
    rng = random.Random(3)
    blob = save_numpy(state_dict(rng, 4) | {"big": np.zeros(300_000, np.float32)})
    (n,) = struct.unpack_from("<Q", blob)
    header = json.loads(blob[8:8 + n])
    lying = dict(header)
    first = next(k for k in header if k != "__metadata__")
    lying[first] = dict(header[first], data_offsets=[0, 7])  # does not match its shape
    lying_raw = json.dumps(lying).encode()
    cases = {
        "random": rng.randbytes(1 << 20),
        "empty": b"",
        "bad json": struct.pack("<Q", 10) + b"{not json}" + bytes(1 << 20),
        "lying header": struct.pack("<Q", len(lying_raw)) + lying_raw + blob[8 + n:],
    }
    for name, data in cases.items():
        assert learnt_pieces(data, BATCH) == [], name
    # a first batch too short to tell what the file is stays whole (a hold at 0) for the next
    assert learnt(fed(blob, [8 + n - 1, 1 << 20])[0]) == compactor_pieces(blob)
    # a header longer than a first batch that was long enough to look at: cut by content
    long_header = save_numpy(state_dict(rng, 4) | {"big": np.zeros(300_000, np.float32)}, metadata={"x": "y" * 100_000})
    assert learnt(fed(long_header, [80_000, 1 << 20])[0]) == []
    assert learnt(fed(long_header, [200_000, 1 << 20])[0]) == compactor_pieces(long_header)


def test_stream_reader_reads_across_pieces() -> None:
    data = bytes(range(256)) * 40
    cuts = [0, 1, 1, 700, 5000, len(data)]
    pieces = [data[a:b] for a, b in zip(cuts, cuts[1:])]
    read = stream_reader(pieces, 1000)
    rng = random.Random(1)
    for _ in range(300):
        off, n = rng.randrange(1000, 1000 + len(data)), rng.randrange(0, 3000)
        assert read(off, n) == data[off - 1000:off - 1000 + n]
    assert read(1000 + len(data), 10) == b""


def write_through_session(store: Store, name: bytes, blob: bytes, sizes: list[int]) -> int:
    ino = store.create(ROOT_INO, name).ino
    with store.open_session(ino) as s:
        pos, i = 0, 0
        while pos < len(blob):
            n = sizes[i % len(sizes)]
            s.write(pos, blob[pos:pos + n])
            pos += n
            i += 1
        assert s.streaming
        s.commit()
    return ino


def test_chunks_end_at_every_piece_and_shifted_tensors_dedup(store: Store) -> None:
    rng = random.Random(11)
    tensors = {f"t{i}": np.frombuffer(rng.randbytes(4 * k), np.float32)
               for i, k in enumerate([600_000, 1_500_000, 3, 1_000_000, 5000])}
    blob = save_numpy(tensors)
    ino = write_through_session(store, b"a.safetensors", blob, [1 << 20, 77_777, 4096])
    ends = {e.offset + e.length for e in extents(store, ino)}
    assert {b for _, b in compactor_pieces(blob)} <= ends
    assert {a for a, _ in compactor_pieces(blob)} <= ends | {0}
    assert store.read_file("/a.safetensors") == blob

    before = store.stats()["stored_bytes"]
    # the same tensors after a longer header: every byte of data shifted; the pieces still match
    shifted = save_numpy(tensors, metadata={"note": "x" * 5000})
    assert shifted[-1000:] == blob[-1000:] and len(shifted) > len(blob)
    write_through_session(store, b"b.safetensors", shifted, [1 << 20])
    added = store.stats()["stored_bytes"] - before
    assert added < 64 << 10, added  # the header and the small tensors' content chunks only
    assert store.read_file("/b.safetensors") == shifted


def test_other_files_are_cut_by_content_as_before(store: Store) -> None:
    rng = random.Random(5)
    data = rng.randbytes(3 * BATCH + 12345)
    ino = write_through_session(store, b"r.bin", data, [1 << 20])
    lengths = [e.length for e in extents(store, ino)]
    assert max(lengths) <= 256 << 10 and sum(lengths) == len(data)
    assert store.read_file("/r.bin") == data
    assert MIN_TENSOR_BYTES > 0
