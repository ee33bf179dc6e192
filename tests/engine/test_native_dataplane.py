"""The write path's native batch functions (native/dataplane.c, native/cdc.c) against their
Python references: pyfastcdc's cuts, the blake3 package's ids, records.encode_record's bytes;
on one thread (pyfastcdc's loop) and on several (every position marked, then the cuts picked)."""
from __future__ import annotations

import os
import random
import threading

import blake3
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyfastcdc.cy import FastCDC
from pyfastcdc.py import FastCDC as PyFastCDC

from cowfs import _native
from cowfs.store import Store
from cowfs.store.data.chunking import AVG_CHUNK, CDC_PARAMS, MAX_CHUNK, MIN_CHUNK, StreamChunker, cut_all
from cowfs.store.log.device import round_up
from cowfs.store.log.log import ALIGNED_MIN
from cowfs.store.log.records import encode_record, record_span

REFERENCE = FastCDC(avg_size=AVG_CHUNK, min_size=MIN_CHUNK, max_size=MAX_CHUNK)
REFERENCE_CONFIG = PyFastCDC(avg_size=AVG_CHUNK, min_size=MIN_CHUNK, max_size=MAX_CHUNK).config


def reference_cuts(data: bytes, final: bool) -> list[int]:
    cuts = [c.length for c in REFERENCE.cut_buf(data)] if data else []
    if not final and cuts:
        cuts.pop()
    return cuts


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    out, pos = [], 0
    for n in cuts:
        out.append(data[pos:pos + n])
        pos += n
    out.append(data[pos:])
    return out


THREADS = [1, 2, 3, 8]


def native(pieces: list, final: bool, threads: int = 1) -> tuple[list[int], list[bytes], int]:
    lengths, ids, consumed = _native.cdc_hash_batch(CDC_PARAMS, pieces, final, True, threads)
    sizes = memoryview(lengths).cast("I").tolist()
    return sizes, [ids[i:i + 32] for i in range(0, len(ids), 32)], consumed


def check(data: bytes, piece_cuts: list[int], final: bool, threads: int = 1) -> None:
    pieces = split(data, piece_cuts)
    sizes, ids, consumed = native(pieces, final, threads)
    assert sizes == reference_cuts(data, final)
    assert consumed == sum(sizes)
    pos = 0
    for n, cid in zip(sizes, ids):
        assert cid == blake3.blake3(data[pos:pos + n]).digest()
        pos += n


def low_entropy(n: int, rng: random.Random) -> bytes:
    """Runs of repeated bytes: long stretches where the gear hash never cuts (max-size chunks)."""
    out = bytearray()
    while len(out) < n:
        out += bytes([rng.randrange(4)]) * rng.randrange(1, 200_000)
    return bytes(out[:n])


@settings(max_examples=60, deadline=None)
@given(size=st.integers(0, 3 * MAX_CHUNK), seed=st.integers(0, 2**32 - 1), final=st.booleans(),
       kind=st.sampled_from(["random", "low"]), n_pieces=st.integers(0, 12), threads=st.sampled_from(THREADS))
def test_cuts_and_ids_equal_the_references(size: int, seed: int, final: bool, kind: str, n_pieces: int,
                                           threads: int) -> None:
    rng = random.Random(seed)
    data = rng.randbytes(size) if kind == "random" else low_entropy(size, rng)
    piece_cuts = sorted(rng.randrange(size + 1) for _ in range(n_pieces))
    check(data, [b - a for a, b in zip([0, *piece_cuts], piece_cuts)], final, threads)


@pytest.mark.parametrize("threads", [2, 5, 64])
def test_threads_with_tiny_pieces_across_their_borders(threads: int) -> None:
    """Pieces shorter than a hash window (63 bytes) everywhere, also where the marking
    threads' ranges meet: each window is taken from the pieces before it."""
    rng = random.Random(threads)
    data = rng.randbytes(5 * AVG_CHUNK + 12_345)
    cuts: list[int] = []
    left = len(data)
    while left:
        n = min(left, rng.choice([1, 2, 31, 62, 63, 64, 65, 127, 4096, 70_000]))
        cuts.append(n)
        left -= n
    check(data, cuts[:-1], True, threads)
    check(data, cuts[:-1], False, threads)


@pytest.mark.parametrize("size", [0, 1, 63, 64, MIN_CHUNK - 1, MIN_CHUNK, MIN_CHUNK + 1, AVG_CHUNK, MAX_CHUNK - 1,
                                  MAX_CHUNK, MAX_CHUNK + 1, 2 * MAX_CHUNK + 3, 8 << 20])
def test_edge_sizes_and_one_byte_pieces_at_the_front(size: int) -> None:
    data = os.urandom(size)
    check(data, [], True)
    check(data, [], False)
    check(data, [1] * min(size, 33), True)  # pieces of one byte: every parity of a piece boundary
    check(bytes(size), [size // 3], True)  # zeros: no cut before MAX_CHUNK
    for threads in THREADS[1:]:
        check(data, [], True, threads)
        check(data, [1] * min(size, 33), False, threads)
        check(bytes(size), [size // 3], True, threads)


def test_empty_pieces_anywhere() -> None:
    data = os.urandom(3 * AVG_CHUNK)
    pieces = [b"", data[:1000], b"", b"", data[1000:70_001], b"", data[70_001:], b""]
    sizes, _ids, consumed = native(pieces, True)
    assert sizes == reference_cuts(data, True) and consumed == len(data)
    assert native([], True) == ([], [], 0) and native([b"", b""], False) == ([], [], 0)


def test_any_buffer_kind() -> None:
    data = os.urandom(5 * AVG_CHUNK)
    ref = native([data], True)
    assert native([bytearray(data[:100]), memoryview(data)[100:]], True) == ref
    assert native((data[:7], data[7:]), True) == ref  # a tuple of pieces too


def test_the_stream_chunker_cuts_as_one_buffer() -> None:
    data = os.urandom(40 * AVG_CHUNK)
    whole = reference_cuts(data, True)
    rng = random.Random(7)
    s = StreamChunker()
    got: list[int] = []
    pos = 0
    while pos < len(data):
        n = rng.randrange(1, 1 << 20)
        got += s.cut([data[pos:pos + n]]).sizes()
        pos += n
    got += s.cut([], final=True).sizes()
    assert got == whole and s.offset == len(data) and s.carried == 0


def test_bad_inputs_get_clear_errors() -> None:
    with pytest.raises(ValueError, match="parameters"):
        _native.cdc_hash_batch(b"short", [b"x"], True)
    with pytest.raises(TypeError):
        _native.cdc_hash_batch(CDC_PARAMS, [b"x", 3], True)
    with pytest.raises(TypeError, match="list or tuple"):
        _native.cdc_hash_batch(CDC_PARAMS, 5, True)
    with pytest.raises(ValueError, match="2048"):
        _native.cdc_config(b"x" * 10, b"x" * 2048, 1, 1, 64, 128, 256)
    with pytest.raises(ValueError, match="sizes"):
        _native.cdc_config(b"x" * 2048, b"x" * 2048, 1, 1, 512, 128, 256)
    with pytest.raises(ValueError, match="bit 63"):
        _native.cdc_config(b"x" * 2048, b"x" * 2048, 1 << 63, 1, 64, 128, 256)
    for threads in (0, -1, 65):
        with pytest.raises(ValueError, match="threads"):
            _native.cdc_hash_batch(CDC_PARAMS, [b"x"], True, True, threads)
        with pytest.raises(ValueError, match="threads"):
            _native.stage_records([b"x"], b"", b"", b"", threads)


def test_many_threads_at_once() -> None:
    datas = [os.urandom(2 << 20) for _ in range(8)]
    want = [native([d], True) for d in datas]
    got: list = [None] * 8

    def run(i: int) -> None:
        for _ in range(3):
            got[i] = native([datas[i][:5000], datas[i][5000:]], True)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == want


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n_pieces=st.integers(0, 6), threads=st.sampled_from(THREADS))
def test_staged_records_equal_encode_record(seed: int, n_pieces: int, threads: int) -> None:
    rng = random.Random(seed)
    data = rng.randbytes(rng.randrange(0, 24 * AVG_CHUNK))
    piece_cuts = sorted(rng.randrange(len(data) + 1) for _ in range(n_pieces))
    pieces = split(data, [b - a for a, b in zip([0, *piece_cuts], piece_cuts)])
    lengths, ids, _ = _native.cdc_hash_batch(CDC_PARAMS, pieces, True, True, threads)
    sizes = memoryview(lengths).cast("I").tolist()
    picks = bytes(rng.randrange(2) for _ in sizes)
    staged = _native.stage_records(pieces, lengths, ids, picks, threads)
    want, pos = b"", 0
    for i, n in enumerate(sizes):
        if picks[i]:
            want += encode_record(ids[32 * i:32 * i + 32], data[pos:pos + n], n)
        pos += n
    assert bytes(staged) == want


def test_stage_records_refuses_what_does_not_add_up() -> None:
    data = os.urandom(3 * AVG_CHUNK)
    lengths, ids, _ = _native.cdc_hash_batch(CDC_PARAMS, [data], True)
    n = len(lengths) // 4
    with pytest.raises(ValueError, match="disagree"):
        _native.stage_records([data], lengths, ids[:-1], bytes(n))
    with pytest.raises(ValueError, match="more than the pieces hold"):
        _native.stage_records([data[:-1]], lengths, ids, bytes([1]) * n)
    assert _native.stage_records([data], lengths, ids, bytes(n)) == bytearray()


def _only_head(log) -> tuple[int, int]:
    """(segment, end) of a log's one head segment ((0, 0) before its first append): one
    thread appends, so it never opens a second head."""
    heads = log.head_positions()
    assert len(heads) <= 1
    return next(iter(heads.items()), (0, 0))


def test_staged_records_cross_segment_rotations_and_read_back(tmp_path) -> None:
    """Log.append_staged writes a staged buffer a slice per segment (10 MiB of records into
    4 MiB segments): every record reads back checked (header, id, BLAKE3); a buffer that
    does not hold the records of the given lengths is refused before anything is written."""
    Store.init(tmp_path / "s", segment_size=4 << 20)
    with Store.open(tmp_path / "s") as s:
        data = os.urandom(10 << 20)
        lengths, ids, _ = _native.cdc_hash_batch(CDC_PARAMS, [data], True)
        sizes = memoryview(lengths).cast("I").tolist()
        staged = _native.stage_records([data], lengths, ids, b"\1" * len(sizes))
        heads = s.log.head_positions()
        with pytest.raises(ValueError, match="staged records"):
            s.log.append_staged(staged[:-64], sizes)
        assert s.log.head_positions() == heads
        locs = s.log.append_staged(staged, sizes)
        assert len({loc.seg_id for loc in locs}) >= 3
        pos = 0
        for i, (n, loc) in enumerate(zip(sizes, locs)):
            assert bytes(s.log.read_chunk(loc, ids[32 * i:32 * i + 32])) == data[pos:pos + n]
            pos += n


def test_cut_all_gives_the_cuts_without_ids() -> None:
    data = os.urandom(2 << 20)
    lengths, ids, consumed = _native.cdc_hash_batch(CDC_PARAMS, [data], True, False)
    assert ids == b"" and consumed == len(data)
    assert memoryview(lengths).cast("I").tolist() == reference_cuts(data, True)
    assert [len(c) for c in cut_all(data)] == reference_cuts(data, True)


def window_hashes(data: bytes) -> np.ndarray:
    """The gear hash of the 64 bytes ending at each position (fewer at the start), by numpy:
    what the threaded path marks positions by."""
    b = np.frombuffer(data, dtype=np.uint8)
    gear = np.frombuffer(REFERENCE_CONFIG.gear.tobytes(), dtype=np.uint64)
    w = np.zeros(len(b), dtype=np.uint64)
    for j in range(64):
        w[j:] += gear[b[:len(b) - j]] << np.uint64(j)
    return w


def small_chunk_positions(data: bytes) -> list[int]:
    w = window_hashes(data)
    return np.nonzero((w & np.uint64(REFERENCE_CONFIG.mask_s)) == 0)[0].tolist()


@pytest.mark.parametrize("threads", [1, 2])
def test_a_cut_in_a_chunks_first_64_hashed_bytes(threads: int) -> None:
    """The first 64 positions after min_size hash fewer than 64 bytes, so their hash is not
    the window hash the threads mark by: the stream starts where a window-hash cut position
    falls at each of them (and the cut is or is not made as pyfastcdc decides)."""
    data = random.Random(11).randbytes(1 << 20)
    start_pos = MIN_CHUNK // 2 * 2
    c = next(p for p in small_chunk_positions(data) if p > start_pos + 64)
    for r in range(66):
        check(data[c - start_pos - r:c - start_pos - r + 3 * AVG_CHUNK], [], True, threads)


@pytest.mark.parametrize("threads", [2, 3])
def test_a_cut_near_a_piece_start(threads: int) -> None:
    """A cut position within the first 63 bytes of a piece: its window is taken from the
    piece before (the threads' small copy)."""
    data = random.Random(12).randbytes(1 << 20)
    c = next(p for p in small_chunk_positions(data) if p > 300_000)
    stream = data[c - MIN_CHUNK - 1000:c + 3 * AVG_CHUNK]
    at = MIN_CHUNK + 1000  # c in `stream`: past the first chunk's exactly hashed bytes
    for r in range(0, 66, 1):
        check(stream, [at - r], True, threads)
        check(stream, [at - r - 40, 40], True, threads)  # a 40-byte piece before it too


@pytest.mark.parametrize("device", ["direct", "file"])
def test_staged_batches_into_the_logs_staging_buffers(tmp_path, device: str) -> None:
    """Records staged into Log.staging buffers: on a direct segment a batch of ALIGNED_MIN or
    more starts on a block boundary and the head moves to the next one (nothing copied); a
    small batch, the file device, and a batch that crosses into a new segment append where
    the head is. Every record reads back checked."""
    Store.init(tmp_path / "s", device=device, segment_size=4 << 20)
    with Store.open(tmp_path / "s") as s:
        log = s.log
        direct = device == "direct"
        written = []
        gaps = 0
        for size in (5000, 3 << 20, 100_000, 3 << 20, 6 << 20):  # small, aligned, small, aligned, across a rotation
            data = os.urandom(size)
            lengths, ids, _ = _native.cdc_hash_batch(CDC_PARAMS, [data], True)
            sizes = memoryview(lengths).cast("I").tolist()
            need = sum(record_span(n) for n in sizes)
            seg_before, head_before = _only_head(log)
            with log.staging(need) as staged:
                assert _native.stage_records([data], lengths, ids, b"\1" * len(sizes), 1, staged) == need
                locs = log.append_staged(staged, sizes)
            first = locs[0]
            aligned = direct and need >= ALIGNED_MIN and first.seg_id == seg_before
            if first.seg_id == seg_before:
                assert first.offset == (round_up(head_before) if aligned else head_before)
                gaps += first.offset != head_before
            if aligned and locs[-1].seg_id == seg_before:
                assert _only_head(log)[1] == round_up(locs[-1].offset + record_span(locs[-1].stored_len))
            written.append((data, sizes, ids, locs))
        assert (gaps >= 2) if direct else gaps == 0  # aligned batches after an unaligned head
        with pytest.raises(ValueError, match="buffer holds"):
            _native.stage_records([data], lengths, ids, b"\1" * len(sizes), 1, bytearray(10))
        log.sync()
        for data, sizes, ids, locs in written:
            pos = 0
            for i, (n, loc) in enumerate(zip(sizes, locs)):
                assert bytes(log.read_chunk(loc, ids[32 * i:32 * i + 32])) == data[pos:pos + n]
                pos += n
