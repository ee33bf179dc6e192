"""chains.py: encoded records decoded a batch at a time, their delta bases located and read a
level at a time. Against the record-by-record reference (codecs.decode through every base),
on random chains, with the reads and queries counted, and on damage."""
from __future__ import annotations

import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cowfs.errors import CorruptData
from cowfs.store.log.chains import decode_batch, runs_of
from cowfs.store.log.codecs import ID_SIZE, Encoded, decode, encode_delta, encode_whole
from cowfs.store.log.layout import MAX_CHAIN
from cowfs.store.log.records import CODEC_RAW, MAX_RUN, Location, record_span

NEVER = 1 << 40  # encode_delta's `whole_len`: any delta is small enough


class FakeLog:
    """Records laid out back to back in segments of a dict, read as Log.read_run reads them:
    each payload into its dest, the header's CRC32 returned; reads and queries counted."""

    def __init__(self) -> None:
        self.records: dict[bytes, tuple[Location, bytes, int]] = {}  # id -> (where, payload, crc)
        self.ends: dict[int, int] = {}
        self.reads: list[tuple[int, int, int]] = []  # (segment, offset, records)
        self.queries = 0

    def put(self, cid: bytes, enc: Encoded, raw_len: int, seg: int = 0) -> None:
        at = self.ends.get(seg, 0)
        payload = bytes(enc.payload)
        loc = Location(seg, at, len(payload), enc.codec, None if enc.codec == CODEC_RAW else raw_len)
        self.records[cid] = (loc, payload, zlib.crc32(payload))
        self.ends[seg] = at + loc.span

    def read_run(self, seg: int, offset: int, items: list[tuple[bytes, memoryview]], verify: bool) -> list[int]:
        assert not verify
        self.reads.append((seg, offset, len(items)))
        crcs, at = [], offset
        for cid, dest in items:
            loc, payload, crc = self.records[cid]
            assert (loc.seg_id, loc.offset) == (seg, at), "a run's records lie back to back"
            dest[:] = payload
            crcs.append(crc)
            at += record_span(len(payload))
        return crcs

    def locate_many(self, ids: list[bytes]) -> dict[bytes, Location]:
        self.queries += 1
        return {cid: self.records[cid][0] for cid in ids if cid in self.records}

    def reference(self, cid: bytes) -> bytes:
        loc, payload, _crc = self.records[cid]
        return bytes(decode(loc.codec, payload, loc.length, self.reference))

    def batch(self, ids: list[bytes]) -> list[bytes]:
        items = []
        for cid in ids:
            loc, payload, _crc = self.records[cid]
            items.append((cid, loc, memoryview(payload), memoryview(bytearray(loc.length))))
        decode_batch(items, self.read_run, self.locate_many)
        return [bytes(dest) for _c, _l, _p, dest in items]


def versions(pieces: int, depth: int, seed: int, n: int = 4096) -> list[list[np.ndarray]]:
    """versions[v][p]: float32 piece p of checkpoint v; each checkpoint one small step on."""
    rng = np.random.default_rng(seed)
    first = [rng.standard_normal(n).astype(np.float32) for _ in range(pieces)]
    out = [first]
    for _ in range(depth):
        out.append([w + rng.standard_normal(n).astype(np.float32) * np.float32(1e-3) for w in out[-1]])
    return out


def cid(v: int, p: int) -> bytes:
    return bytes([v, p]) * (ID_SIZE // 2)


def store_series(log: FakeLog, vs: list[list[np.ndarray]], keyframe_raw: bool = True) -> None:
    """The newest checkpoint raw (or grouped), each older piece a delta against the same piece one
    checkpoint newer; each checkpoint's pieces back to back, newest first, in segment 0."""
    newest = len(vs) - 1
    for v in range(newest, -1, -1):
        for p, w in enumerate(vs[v]):
            raw = w.tobytes()
            if v == newest:
                enc = Encoded(CODEC_RAW, raw) if keyframe_raw else encode_whole(raw, 4)
            else:
                enc = encode_delta(raw, 4, cid(v + 1, p), vs[v + 1][p].tobytes(), NEVER)
                assert enc is not None
            log.put(cid(v, p), enc, len(raw))


def test_a_window_of_chains_is_read_a_level_at_a_time() -> None:
    log = FakeLog()
    depth = MAX_CHAIN - 1
    vs = versions(4, depth, 1)
    store_series(log, vs)
    got = log.batch([cid(0, p) for p in range(4)])  # the oldest: three deltas deep
    assert got == [w.tobytes() for w in vs[0]]
    assert log.queries == depth  # one catalog query per level, not one per base
    assert len(log.reads) == depth and all(n == 4 for _s, _o, n in log.reads)  # one read per level's run


def test_a_base_two_records_share_is_read_and_decoded_once() -> None:
    log = FakeLog()
    base = np.arange(2048, dtype=np.float32)
    log.put(b"B" * ID_SIZE, encode_whole(base.tobytes(), 4), base.nbytes)
    raws = []
    for k in range(2):
        raw = (base + np.float32(k + 1)).tobytes()
        enc = encode_delta(raw, 4, b"B" * ID_SIZE, base.tobytes(), NEVER)
        assert enc is not None
        log.put(bytes([k]) * ID_SIZE, enc, len(raw), seg=1)
        raws.append(raw)
    assert log.batch([b"\0" * ID_SIZE, b"\1" * ID_SIZE]) == raws
    assert log.reads == [(0, 0, 1)]


@settings(max_examples=25, deadline=None)
@given(pieces=st.integers(1, 5), depth=st.integers(0, MAX_CHAIN - 1), seed=st.integers(0, 2**31),
       keyframe_raw=st.booleans(), pick=st.lists(st.tuples(st.integers(0, MAX_CHAIN - 1), st.integers(0, 4)),
                                                 min_size=1, max_size=8, unique=True))
def test_any_batch_decodes_as_record_by_record(pieces: int, depth: int, seed: int, keyframe_raw: bool,
                                              pick: list[tuple[int, int]]) -> None:
    log = FakeLog()
    vs = versions(pieces, depth, seed, n=1024)
    store_series(log, vs, keyframe_raw)
    ids = [cid(v, p) for v, p in pick if v <= depth and p < pieces]
    ids = [i for i in ids if log.records[i][0].encoded]
    if not ids:
        return
    assert log.batch(ids) == [log.reference(i) for i in ids]


def damaged(how: str) -> FakeLog:
    log = FakeLog()
    store_series(log, versions(2, 2, 3))
    if how == "missing":
        del log.records[cid(1, 0)]
    elif how == "flipped":
        loc, payload, crc = log.records[cid(2, 0)]
        log.records[cid(2, 0)] = (loc, payload[:100] + bytes([payload[100] ^ 1]) + payload[101:], crc)
    return log


@pytest.mark.parametrize("how, says", [("missing", "is missing"), ("flipped", "payload checksum mismatch")])
def test_a_damaged_or_missing_base_is_corrupt_data(how: str, says: str) -> None:
    log = damaged(how)
    with pytest.raises(CorruptData, match=says):
        log.batch([cid(0, 0), cid(0, 1)])
    assert log.batch([cid(0, 1)])  # the other piece's chain is whole


def test_a_chain_longer_than_the_bound_is_corrupt_data() -> None:
    log = FakeLog()
    store_series(log, versions(1, MAX_CHAIN, 4))  # one record more than a read may touch
    with pytest.raises(CorruptData, match="longer than"):
        log.batch([cid(0, 0)])
    assert log.batch([cid(1, 0)])


def test_runs_split_at_gaps_segments_and_the_run_limit() -> None:
    def loc(seg: int, off: int) -> Location:
        return Location(seg, off, 4096 - 64)  # a span of one 4 KiB block
    recs = [(k.to_bytes(2, "big"), loc(0, k * 4096)) for k in range(MAX_RUN + 2)]
    recs += [(b"g", loc(0, (MAX_RUN + 3) * 4096)), (b"s", loc(1, 0))]
    runs = runs_of(reversed(recs))
    assert [(s, o, len(r)) for s, o, r in runs] == [(0, 0, MAX_RUN), (0, MAX_RUN * 4096, 2), (0, (MAX_RUN + 3) * 4096, 1),
                                                    (1, 0, 1)]
