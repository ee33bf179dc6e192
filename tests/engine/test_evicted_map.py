"""Eviction maps (format.md 9.8) and reads through them, against the segment bytes they stand
for: a model-based test with packs held in memory (the PackReader interface; the real one,
ranged GETs from RGW, is tested in tests/remote/test_evict.py)."""
from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cowfs.errors import CorruptData
from cowfs.store.log.evicted import EvictedSegment, EvictionMap, MapEntry, _carve, decode_map


class MemoryPacks:
    def __init__(self, packs: dict[str, bytes]) -> None:
        self.packs = packs
        self.hints: list[tuple[str, int, int]] = []

    def read_into(self, pack: str, size: int, offset: int, buffers: list[memoryview]) -> int:
        data = self.packs[pack][offset:]
        got = 0
        for b in buffers:
            n = min(len(b), len(data) - got)
            b[:n] = data[got:got + n]
            got += n
        return got

    def will_need(self, pack: str, size: int, offset: int, length: int) -> None:
        self.hints.append((pack, offset, length))

    def close(self) -> None:
        pass


def layout(seed: int, records: int) -> tuple[bytes, EvictionMap, MemoryPacks]:
    """A segment of `records` records of 64-byte multiples with gaps, spread over 3 packs
    in shuffled order; returns (the segment's bytes, its map, the packs)."""
    rnd = random.Random(seed)
    seg = bytearray(64)
    spans = []
    for _ in range(records):
        if rnd.random() < 0.3:
            seg += bytes(64 * rnd.randint(1, 3))  # a gap: a dead record
        span = 64 * rnd.randint(1, 6)
        spans.append((len(seg), span))
        seg += rnd.randbytes(span)
    names = [f"{k:064x}" for k in range(3)]
    bodies = {n: bytearray(rnd.randbytes(64 * rnd.randint(0, 2))) for n in names}
    entries = []
    order = list(range(records))
    if rnd.random() < 0.5:  # else in segment order: runs of records back to back in one pack
        rnd.shuffle(order)
    p = 0
    for k in order:
        off, span = spans[k]
        if rnd.random() < 0.3:
            p = rnd.randrange(3)
        entries.append(MapEntry(off, len(bodies[names[p]]), span, p))
        bodies[names[p]] += seg[off:off + span]
    packs = {n: bytes(b) for n, b in bodies.items()}
    emap = EvictionMap(7, len(seg), [(n, len(packs[n])) for n in names], sorted(entries, key=lambda e: e.seg_offset))
    return bytes(seg), emap, MemoryPacks(packs)


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 30), st.data())
def test_reads_through_a_map_equal_the_segment_bytes(seed, records, draw):
    seg, emap, packs = layout(seed, records)
    emap = decode_map(emap.encode(), "test")  # what is read is what was written
    evicted = EvictedSegment(emap, packs)
    entry = draw.draw(st.sampled_from(emap.entries))
    # a run of back-to-back records from one record's start, into buffers cut anywhere
    end = entry.seg_offset + entry.span
    for e in emap.entries:
        if e.seg_offset == end:
            end += e.span
    length = draw.draw(st.integers(1, end - entry.seg_offset))
    cuts = sorted(draw.draw(st.lists(st.integers(0, length), max_size=4)))
    bounds = [0, *cuts, length]
    buf = bytearray(length)
    views = [memoryview(buf)[a:b] for a, b in zip(bounds, bounds[1:])]
    assert evicted.read_into(entry.seg_offset, views) == length
    assert bytes(buf) == seg[entry.seg_offset:entry.seg_offset + length]
    assert evicted.read(entry.seg_offset, length) == seg[entry.seg_offset:entry.seg_offset + length]


def test_a_read_into_a_gap_is_short():
    seg, emap, packs = layout(3, 12)
    evicted = EvictedSegment(emap, packs)
    e = emap.entries[0]
    nxt = emap.entries[1]
    if nxt.seg_offset == e.seg_offset + e.span:  # make sure of a gap after the first record
        emap = EvictionMap(emap.seg_id, emap.committed_end, emap.packs, [e, *emap.entries[2:]])
        evicted = EvictedSegment(emap, packs)
    got = evicted.read_into(e.seg_offset, [memoryview(bytearray(e.span + 64))])
    assert got == e.span
    assert evicted.read_into(e.seg_offset + e.span, [memoryview(bytearray(64))]) == 0
    evicted.will_need(e.seg_offset, e.span)
    assert packs.hints and packs.hints[0][2] == e.span


def test_damaged_maps_are_refused():
    _, emap, _ = layout(5, 8)
    raw = bytearray(emap.encode())
    assert decode_map(bytes(raw), "m") == emap
    for pos in (0, 10, 45, len(raw) // 2, len(raw) - 1):
        bad = bytearray(raw)
        bad[pos] ^= 0x40
        with pytest.raises(CorruptData):
            decode_map(bytes(bad), "m")
    with pytest.raises(CorruptData, match="truncated"):
        decode_map(bytes(raw[:20]), "m")
    e = emap.entries[0]
    outside = EvictionMap(emap.seg_id, emap.committed_end, emap.packs,
                          [MapEntry(e.seg_offset, emap.packs[e.pack][1], e.span, e.pack)])
    with pytest.raises(CorruptData, match="outside its pack"):
        decode_map(outside.encode(), "m")


def test_carve_splits_buffers_at_any_boundary():
    buf = bytearray(range(100))
    views = [memoryview(buf)[:30], memoryview(buf)[30:31], memoryview(buf)[31:]]
    groups = _carve(views, [10, 25, 65])
    assert [b"".join(bytes(v) for v in g) for g in groups] == [bytes(buf[:10]), bytes(buf[10:35]), bytes(buf[35:])]


def test_a_segment_dropped_during_a_read_closes_after_it(tmp_path):
    """Eviction drops a segment from the log while a read may be using its file: the file
    closes when that read ends, not under it."""
    import threading

    from cowfs.store import ROOT_INO, Store
    from cowfs.store.log.log import LOCATION_COLS, location
    from tests.support.storeutil import data, new_store

    path = new_store(tmp_path / "s", segment_size=4 << 20)
    with Store.open(path) as s:
        s.mkdir(ROOT_INO, b"run")
        s.write_file("/run/a", data(3 << 20, 1))
        s.write_file("/run/b", data(3 << 20, 2))
        h, *loc = s.catalog.read(lambda c: c.execute(
            f"SELECT hash, {LOCATION_COLS} FROM chunks WHERE seg_id=1 ORDER BY offset LIMIT 1").fetchone())
        loc = location(*loc)
        seg = s.log.segment(1)
        inside, go_on = threading.Event(), threading.Event()
        real = seg.read_into

        def slow_read(offset, buffers):
            inside.set()
            assert go_on.wait(60)
            return real(offset, buffers)

        seg.read_into = slow_read
        out: list[object] = []
        reader = threading.Thread(target=lambda: out.append(s.log.read_run(1, loc.offset, [
            (bytes(h), memoryview(bytearray(loc.stored_len)))])))
        reader.start()
        assert inside.wait(60)
        s.log.drop_evicted(1)
        assert seg.fd >= 0, "closed under a read in flight"
        go_on.set()
        reader.join(60)
        assert out and seg.fd == -1, "closed once the read ended"
        assert s.log.segment(1) is not seg  # opened afresh (here: the file is still there)


def test_recovery_keeps_the_file_when_a_map_beside_it_is_damaged(tmp_path):
    """An eviction cut short leaves map and file; a damaged map then goes, the file stays."""
    from cowfs.store import ROOT_INO, Store
    from cowfs.store.log.evicted import map_path
    from cowfs.store.log.layout import segment_path
    from tests.support.storeutil import assert_clean, data, new_store

    path = new_store(tmp_path / "s", segment_size=4 << 20)
    with Store.open(path) as s:
        s.mkdir(ROOT_INO, b"run")
        s.write_file("/run/a", data(3 << 20, 1))
        s.write_file("/run/b", data(3 << 20, 2))
    map_path(path, 1).write_bytes(b"CWFSEVM1 torn or damaged")
    with Store.open(path) as s:
        assert not map_path(path, 1).exists() and segment_path(path, 1).exists()
        assert s.read_file("/run/a") == data(3 << 20, 1)
    assert_clean(path)
