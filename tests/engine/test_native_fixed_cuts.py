"""`cdc_hash_batch`'s fixed regions (native/dataplane.c, `cut_fixed`), the cuts a tensor file
gets at write time: against a Python reference built on pyfastcdc, on random and edge inputs,
on one thread and on several; and its refusals of bad regions."""
from __future__ import annotations

import random
import struct

import blake3
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cowfs import _native
from cowfs.store.data.chunking import CDC_PARAMS, MAX_CHUNK, MIN_CHUNK
from tests.engine.test_native_dataplane import THREADS, reference_cuts, split

Region = tuple[int, int, int]


def reference(data: bytes, regions: list[Region], final: bool) -> tuple[list[int], int]:
    """The cuts (and the bytes they cover) the doc of cdc_hash_batch promises: the bytes before
    a region cut by content up to its start, the region at start + k * step and its end, a
    region past the end up to its last whole step (to the end when final), the rest by content."""
    total, pos, cuts = len(data), 0, []
    for start, end, step in regions:
        if start >= total:
            break
        if start > pos:
            cuts += reference_cuts(data[pos:start], True)
            pos = start
        while pos + step <= min(end, total):
            cuts.append(step)
            pos += step
        if end > total:
            if final and pos < total:
                cuts.append(total - pos)
                pos = total
            return cuts, pos
        if pos < end:
            cuts.append(end - pos)
            pos = end
    if pos < total:
        tail = reference_cuts(data[pos:], final)
        cuts += tail
        pos += sum(tail)
    return cuts, pos


def packed(regions: list[Region]) -> bytes:
    return b"".join(struct.pack("=3Q", *r) for r in regions)


def native(pieces: list[bytes], regions: list[Region], final: bool, threads: int = 1) -> tuple[list[int], bytes, int]:
    lengths, ids, consumed = _native.cdc_hash_batch(CDC_PARAMS, pieces, final, True, threads, packed(regions))
    return memoryview(lengths).cast("I").tolist(), ids, consumed


def check(data: bytes, piece_cuts: list[int], regions: list[Region], final: bool, threads: int = 1) -> list[int]:
    sizes, ids, consumed = native(split(data, piece_cuts), regions, final, threads)
    want, covered = reference(data, regions, final)
    assert sizes == want
    assert consumed == covered == sum(sizes)
    pos = 0
    for i, n in enumerate(sizes):
        assert ids[32 * i:32 * i + 32] == blake3.blake3(data[pos:pos + n]).digest()
        pos += n
    # every region start, step boundary and end within the covered bytes is a cut
    ends = {0}
    for n in sizes:
        ends.add(max(ends) + n)
    for start, end, step in regions:
        if start >= len(data):
            break
        assert start <= consumed
        marks = [*range(start, min(end, consumed) + 1, step), *([end] if end <= consumed else [])]
        assert set(marks) <= ends
    return sizes


def random_regions(rng: random.Random, total: int, n: int) -> list[Region]:
    points = sorted(rng.randrange(total + MAX_CHUNK + 1) for _ in range(2 * n))
    steps = [rng.choice([MIN_CHUNK, 100_000, 1 << 20, rng.randrange(1, 3 * MAX_CHUNK)]) for _ in range(n)]
    return [(points[2 * i], points[2 * i + 1], steps[i]) for i in range(n)]


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), size=st.integers(0, 3 << 20), n_regions=st.integers(0, 5),
       n_pieces=st.integers(0, 8), final=st.booleans(), threads=st.sampled_from(THREADS))
def test_fixed_regions_equal_the_reference(seed: int, size: int, n_regions: int, n_pieces: int, final: bool,
                                           threads: int) -> None:
    rng = random.Random(seed)
    data = rng.randbytes(size)
    piece_cuts = sorted(rng.randrange(size + 1) for _ in range(n_pieces))
    pieces = [b - a for a, b in zip([0, *piece_cuts], piece_cuts)]
    check(data, pieces, random_regions(rng, size, n_regions), final, threads)


@pytest.mark.parametrize("threads", [1, 4])
def test_edges(threads: int) -> None:
    rng = random.Random(7)
    data = rng.randbytes(2 << 20)
    n = len(data)
    cases: list[list[Region]] = [
        [],  # no regions: plain content cuts
        [(0, n, 1 << 20)],  # the whole stream, exactly two steps
        [(0, n, 3 << 20)],  # one piece longer than the stream... ends at the region's end = the stream's
        [(5, 5, 1000)],  # an empty region: only the cut at its start
        [(n, n + 10, 1000)],  # a region at the end: the bytes before it are cut by content
        [(n + 1, n + 10, 1000)],  # past the end: ignored
        [(100, 200, 7), (200, 300, 50), (300, 300, 1)],  # back to back, tiny steps
        [(1000, n + 5000, 65536)],  # goes on past the end: its last whole step
        [(0, 10, 1), (MIN_CHUNK // 2, MIN_CHUNK // 2 + 3, 1 << 24)],
    ]
    for regions in cases:
        for final in (False, True):
            check(data, [n // 3, n // 3], regions, final, threads)
    # the region goes on: the uncertain tail is left for the next batch, then cut there
    sizes = check(data, [n], [(1000, n + 5000, 65536)], False, threads)
    assert sum(sizes) == 1000 + (n - 1000) // 65536 * 65536
    assert check(b"", [], [(0, 10, 3)], True, threads) == []


def test_bad_regions_are_refused() -> None:
    def run(fixed: bytes) -> None:
        _native.cdc_hash_batch(CDC_PARAMS, [b"x" * 100], True, True, 1, fixed)

    with pytest.raises(ValueError, match="triples"):
        run(b"\0" * 23)
    for bad in ([(10, 5, 1)], [(0, 10, 0)], [(0, 10, (1 << 24) + 1)], [(0, 10, 1), (5, 20, 1)]):
        with pytest.raises(ValueError, match="fixed region"):
            run(packed(bad))
    with pytest.raises(TypeError):
        _native.cdc_hash_batch(CDC_PARAMS, [b"x"], True, True, 1, 12)
    assert native([b"x" * 100], [], True)[0] == [100]  # an empty region list is no region
