"""One body's compaction: steps 1-4 of compact.py's module doc.

Encoding runs in the run's worker threads (Blosc2, BLAKE3 and numpy release the GIL); the
catalog is read for each batch's neighbours and written once, at the end, in one
transaction.
"""
from __future__ import annotations

import sqlite3
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from ... import _native
from ..catalog.db import Txn
from ..data.chunking import cut_all
from ..data.content import Extent, load_extents
from ..data.reader import FileReader
from ..log.codecs import CODEC_RAW, DELTA_CODECS, Encoded, encode_delta, encode_whole
from ..log.log import LOCATION_COLS, Location, location
from . import lineage
from .formats import TensorRegion, regions
from .pieces import Span, plan
from .recent import RecentPieces

if TYPE_CHECKING:
    from ..parts import BodyReading

BATCH_BYTES = 64 << 20  # bytes read, hashed and encoded per step
HEAD_BYTES = 64 << 10


@dataclass
class CompactReport:
    bodies: int = 0  # bodies looked at
    recut: int = 0  # bodies re-cut into tensor pieces
    logical_bytes: int = 0  # bytes of the bodies looked at
    pieces: int = 0  # tensor pieces in the re-cut bodies
    new_chunks: int = 0  # pieces and chunks stored for the first time
    new_stored_bytes: int = 0  # their payload bytes
    deltas: int = 0  # pieces stored or re-encoded as deltas
    delta_saved_bytes: int = 0  # stored bytes those deltas saved against whole records
    regrouped: int = 0  # raw pieces (superseded, or shared by a newer body) grouped and compressed whole
    rewritten: int = 0  # records written for pieces stored before (their old records become garbage)
    stopped: bool = False  # interrupted before every body was done
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)
    gc_chunks_deleted: int = 0  # the gc that gave back what the run replaced (Store.compact): chunks deleted
    gc_bytes_freed: int = 0  # and bytes freed on the device


class Retry(Exception):
    """The catalog changed under a prepared delta (the chain rule no longer holds)."""


def body_regions(reader: FileReader, size: int, name: str) -> list[TensorRegion]:
    """The tensors of a body ([] if no format is recognised), reading only what the parser asks for."""
    return regions(bytes(reader.read_alone(0, HEAD_BYTES)), size, lambda o, n: bytes(reader.read_alone(o, n)),
                   name) or []


@dataclass(frozen=True)
class _Known:
    """A chunk the catalog has: its row, location and the length of its decoding chain."""
    cid: int
    chunk: bytes
    loc: Location
    chain: list[int]


@dataclass
class _Around:
    """A piece's neighbours in its lineage: the nearest compacted bodies after and before it."""
    newer: _Known | None
    older: _Known | None
    older_gen: int
    older_height: int
    me: _Known | None  # the piece itself, if the catalog has it


@dataclass(frozen=True)
class _NewJob:
    chunk: bytes
    view: memoryview
    elem_size: int
    dtype: str
    key: bytes | None  # a tensor piece's tensor key
    newest: bool  # a tensor piece no compacted body after this one has: stored raw
    base: _Known | None  # a tensor piece with a newer neighbour it may lean on
    base_raw: memoryview | None  # the neighbour's raw bytes, if at hand


@dataclass(frozen=True)
class _OldJob:
    target: _Known  # an older piece (or a frozen raw one) to re-encode
    base: bytes | None  # the newer piece it may become a delta against
    base_raw: memoryview | None
    elem_size: int
    dtype: str
    key: bytes | None
    target_raw: memoryview | None = None  # the target's bytes, if at hand (read and checked already)


@dataclass
class _Switch:
    cid: int
    old: Location
    new: Location
    base: bytes | None  # a delta: its base's id; None: grouped whole
    saved: int


@dataclass
class Body:
    store: "BodyReading"
    pool: ThreadPoolExecutor
    content_id: int
    gen: int
    report: "CompactReport"
    stop: Callable[[], bool] | None
    recent: RecentPieces
    waiting: dict[bytes, list[int]]  # compact._waiting_tensors
    found: list[TensorRegion] | None  # the body's tensors if the run has them (else parsed here)
    writer: ThreadPoolExecutor  # one thread: appends run there while the next batch is read and encoded
    pinned: list[bytes] = field(default_factory=list)
    extents: list[Extent] = field(default_factory=list)  # the new body's
    pieces: list[tuple[bytes, int, bytes]] = field(default_factory=list)  # (key, index, chunk) for the lineage
    new_bases: dict[bytes, bytes] = field(default_factory=dict)  # new delta chunk -> its base's id
    new_chains: dict[bytes, int] = field(default_factory=dict)  # new chunk -> records a read of it touches
    switches: list[_Switch] = field(default_factory=list)
    superseded: set[int] = field(default_factory=set)
    written: dict[bytes, Location | None] = field(default_factory=dict)  # new chunks (None: append in flight)
    appends: list[tuple[Future[list[Location]], Callable[[list[Location]], None]]] = field(default_factory=list)

    @property
    def read_chain(self) -> int:
        """Records a read of one piece may touch, the store's setting (at most MAX_CHAIN)."""
        return self.store.config.read_chain

    def run(self) -> bool:
        """False when stopped before the end (nothing changed)."""
        store = self.store
        with store.index.gc_lock.shared():
            loaded = store.catalog.read(lambda conn: extents_and_name(conn, self.content_id))
            if loaded is None:
                return True  # the body went meanwhile (its versions were deleted)
            release = store.holds.hold(self.content_id)
        extents, size, name = loaded
        try:
            self.report.bodies += 1
            self.report.logical_bytes += size
            with store.body_reader(extents, size) as reader:
                found = self.found if self.found is not None else body_regions(reader, size, name)
                spans = plan(size, found) if found else []
                if not any(s.key is not None for s in spans):
                    store.catalog.write(self._mark_done, op="compact")
                    return True
                for batch in _batches(spans):
                    if self.stop is not None and self.stop():
                        return False
                    self._store_batch(reader, batch)
            self._settle()
            store.log.sync()
            with store.index.gc_lock.shared():
                retired = store.catalog.write(self._commit, op="compact")
                store.holds.retire(retired)
            self.report.recut += 1
            return True
        finally:
            try:
                self._settle()  # (stopped or failed: the records appended are garbage)
            finally:
                store.index.unpin(self.pinned)
                release()

    def _append(self, records: list[tuple[bytes, bytes | memoryview, int, int]],
                done: Callable[[list[Location]], None]) -> None:
        """Append in the writer thread, after the appends before it are settled (one in flight);
        `done(locations)` runs in this thread once they are written."""
        self._settle()
        self.appends.append((self.writer.submit(self._append_known, records), done))

    def _append_known(self, records: list[tuple[bytes, bytes | memoryview, int, int]]) -> list[Location]:
        """(writer thread) Append the records and register their locations under gc_lock, as
        a write session's appends are: a gc running beside the compactor never sees a record
        that is written but not yet known (it would punch it as garbage)."""
        index = self.store.index
        with index.gc_lock.shared():
            locs = self.store.log.append_records(records)
            index.add_locations([(r[0], loc) for r, loc in zip(records, locs)])
        return locs

    def _settle(self) -> None:
        """Wait for the appends in flight and take their locations."""
        appends, self.appends = self.appends, []
        for fut, done in appends:
            done(fut.result())

    def _mark_done(self, txn: Txn) -> None:
        txn.execute("UPDATE contents SET compacted=1 WHERE content_id=?", (self.content_id,))

    # -- steps 1 and 2 ------------------------------------------------------------------

    def _store_batch(self, reader: FileReader, batch: list[Span]) -> None:
        lo, hi = batch[0].offset, batch[-1].end
        data = memoryview(bytes(reader.read(lo, hi - lo)))
        cut: list[tuple[Span, memoryview]] = []
        for s in batch:
            view = data[s.offset - lo:s.end - lo]
            if s.key is not None:
                cut.append((s, view))
            else:
                pos = s.offset
                for c in cut_all(view):
                    cut.append((Span(pos, len(c)), c))
                    pos += len(c)
        # the spans tile [lo, hi) in order (pieces.plan), so every id comes from one native call
        blob = _native.blake3_many(data, [len(view) for _s, view in cut])
        ids = [blob[i:i + 32] for i in range(0, len(blob), 32)]
        self.pinned.extend(ids)
        known = self.store.index.pin(ids)
        pieces = [(s, view, h) for (s, view), h in zip(cut, ids) if s.key is not None]
        around = self.store.catalog.read(lambda conn: [self._around(conn, s, h) for s, _v, h in pieces])
        by_chunk = {h: a for (_s, _v, h), a in zip(pieces, around)}
        jobs: dict[bytes, _NewJob] = {}
        for (s, view), h in zip(cut, ids):
            if h in known or h in jobs or h in self.written:
                continue
            newer = by_chunk[h].newer if s.key is not None else None
            base = newer if newer is not None and len(newer.chain) + 1 <= self.read_chain else None  # else a keyframe
            raw = self.recent.get(s.key, s.index, base.chunk) if base is not None and s.key is not None else None
            jobs[h] = _NewJob(h, view, s.elem_size, s.dtype, s.key, s.key is not None and newer is None, base, raw)
        self._append_new(list(jobs.values()))
        for (s, view), h in zip(cut, ids):
            self.extents.append(Extent(s.offset, s.length, h, known.get(h)))  # new chunks: self.written
        for s, _view, h in pieces:
            assert s.key is not None
            self.pieces.append((s.key, s.index, h))
            self.report.pieces += 1
        self._supersede(pieces, around)
        for s, view, h in pieces:
            assert s.key is not None
            self.recent.put(s.key, s.index, h, view)

    def _around(self, conn: sqlite3.Connection, span: Span, h: bytes) -> _Around:
        assert span.key is not None
        newer = lineage.newer(conn, span.key, span.index, self.gen)
        older = lineage.older(conn, span.key, span.index, self.gen)
        me = conn.execute("SELECT cid FROM chunks WHERE hash=?", (h,)).fetchone()
        return _Around(_known(conn, newer[1]) if newer else None, _known(conn, older[1]) if older else None,
                       older[0] if older else 0, lineage.height(conn, older[1]) if older else 0,
                       _known(conn, int(me[0])) if me else None)

    def _append_new(self, jobs: list[_NewJob]) -> None:
        """Step 2: the chunks not stored yet, encoded here and appended in the writer."""
        if not jobs:
            return
        encoded = list(self.pool.map(self._encode_new, jobs))
        for j, (e, saved) in zip(jobs, encoded):
            self.written[j.chunk] = None
            if e.base is not None and j.base is not None:
                self.new_bases[j.chunk] = e.base
                self.new_chains[j.chunk] = 1 + len(j.base.chain)
                self.report.deltas += 1
                self.report.delta_saved_bytes += saved
            else:
                self.new_chains[j.chunk] = 1

        def done(locs: list[Location]) -> None:
            for j, loc in zip(jobs, locs):
                self.written[j.chunk] = loc
                self.report.new_chunks += 1
                self.report.new_stored_bytes += loc.stored_len

        self._append([(j.chunk, e.payload, len(j.view), e.codec) for j, (e, _saved) in zip(jobs, encoded)], done)

    def _encode_new(self, job: _NewJob) -> tuple[Encoded, int]:
        """(record, bytes a delta saved): raw for the newest tensor piece, a delta against
        the newer neighbour when allowed and small enough, else grouped whole."""
        if job.newest:
            return Encoded(CODEC_RAW, job.view), 0
        whole = encode_whole(job.view, job.elem_size)
        if job.base is None:
            return whole, 0
        base_raw = job.base_raw
        if base_raw is None:
            try:
                base_raw = self.store.log.read_chunk(job.base.loc, job.base.chunk)
            except Exception as e:  # a damaged neighbour: this piece is stored whole; fsck names it
                self.report.errors.append(f"chunk {job.base.chunk.hex()[:16]}: not used as a delta base ({e})")
                return whole, 0
        delta = encode_delta(job.view, job.elem_size, job.base.chunk, base_raw, whole.stored_len, job.dtype,
                             self.recent.delta_order(job.key))
        self.recent.note_winner(job.key, delta)
        return (delta, whole.stored_len - delta.stored_len) if delta is not None else (whole, 0)

    # -- step 3 ---------------------------------------------------------------------------

    def _supersede(self, pieces: list[tuple[Span, memoryview, bytes]], around: list[_Around]) -> None:
        """Re-encode the older neighbours these pieces supersede, and raw pieces they share."""
        jobs: list[_OldJob] = []
        for (s, view, h), a in zip(pieces, around):
            assert s.key is not None
            me = a.me
            if me is not None and me.loc.codec == CODEC_RAW and me.cid not in self.superseded and (
                    (a.newer is not None and a.newer.chunk == h) or (a.older is not None and a.older.chunk == h)):
                self.superseded.add(me.cid)  # shared unchanged with a neighbour (frozen): no longer raw
                jobs.append(_OldJob(me, None, None, s.elem_size, s.dtype, s.key))
                continue
            if me is not None and me.loc.codec == CODEC_RAW and me.cid not in self.superseded and a.newer is not None:
                # stored raw by the save (tensor files are cut into pieces as they are written):
                # what step 2 does for a piece not stored yet, a delta against the newer piece
                base = a.newer if me.cid not in a.newer.chain and len(a.newer.chain) + 1 <= self.read_chain else None
                base_raw = self.recent.get(s.key, s.index, base.chunk) if base is not None else None
                if base is not None and base_raw is None:
                    base_raw = self._read_base(base)
                self.superseded.add(me.cid)
                jobs.append(_OldJob(me, base.chunk if base is not None and base_raw is not None else None, base_raw,
                                    s.elem_size, s.dtype, s.key, view))
            q = a.older
            if q is None or q.chunk == h or q.cid in self.superseded or q.loc.codec in DELTA_CODECS \
                    or q.loc.length != len(view):
                continue
            gens = self.waiting.get(s.key)
            if gens and gens[-1] > a.older_gen:
                continue  # a body still waiting lies between: it will be q's neighbour
            my_chain = me.chain if me is not None else [-1] * self.new_chains.get(h, 1)
            lean = q.cid not in my_chain and a.older_height + 1 + len(my_chain) <= self.read_chain
            if not lean and q.loc.codec != CODEC_RAW:
                continue
            self.superseded.add(q.cid)
            jobs.append(_OldJob(q, h if lean else None, view if lean else None, s.elem_size, s.dtype, s.key))
        if not jobs:
            return
        self.pinned.extend(j.target.chunk for j in jobs)
        self.store.index.pin([j.target.chunk for j in jobs])
        results = list(self.pool.map(self._reencode, jobs))
        good = [(job, enc) for job, enc in zip(jobs, results) if enc is not None]
        if not good:
            return

        def done(locs: list[Location]) -> None:
            for (job, enc), loc in zip(good, locs):
                self.switches.append(_Switch(job.target.cid, job.target.loc, loc, enc.base,
                                             job.target.loc.stored_len - loc.stored_len))

        self._append([(j.target.chunk, enc.payload, j.target.loc.length, enc.codec) for j, enc in good], done)

    def _read_base(self, base: _Known) -> memoryview | None:
        """A newer piece's bytes read back (decoded through its chain), for a delta against it;
        None if it cannot be read (the piece is then grouped whole; fsck names the damage)."""
        try:
            return memoryview(self.store.log.read_chunk(base.loc, base.chunk))
        except Exception as e:
            self.report.errors.append(f"chunk {base.chunk.hex()[:16]}: not used as a delta base ({e})")
            return None

    def _reencode(self, job: _OldJob) -> Encoded | None:
        """The piece's new record: a delta if allowed and small enough, else (a raw piece)
        grouped whole; None to keep the record it has."""
        t = job.target
        try:
            raw = job.target_raw if job.target_raw is not None else self.store.log.read_chunk(t.loc, t.chunk)
        except Exception as e:  # a damaged piece stays as it is; fsck reports it
            self.report.errors.append(f"chunk {t.chunk.hex()[:16]}: not re-encoded ({e})")
            return None
        whole = encode_whole(raw, job.elem_size) if t.loc.codec == CODEC_RAW else None
        if job.base is not None and job.base_raw is not None:
            delta = encode_delta(raw, job.elem_size, job.base, job.base_raw,
                                 whole.stored_len if whole is not None else t.loc.stored_len, job.dtype,
                                 self.recent.delta_order(job.key))
            self.recent.note_winner(job.key, delta)
            if delta is not None:
                return delta
        return whole if whole is not None and whole.codec != CODEC_RAW else None

    # -- step 4 ---------------------------------------------------------------------------

    def _commit(self, txn: Txn) -> list[tuple[int, int, int]]:
        first_gen = txn.execute("SELECT min(data_gen) FROM versions WHERE content_id=?", (self.content_id,)).fetchone()[0]
        if first_gen is None:  # every version of it went meanwhile: nothing to repoint
            txn.execute("UPDATE contents SET compacted=1 WHERE content_id=?", (self.content_id,))
            first_gen = 0
        locs: dict[bytes, Location] = {}
        for e in self.extents:
            if e.chunk is not None and e.chunk not in locs:
                loc = e.loc if e.loc is not None else self.written[e.chunk]
                assert loc is not None  # settled before the commit
                locs[e.chunk] = loc
        cids = _cids(txn.conn, list(self.new_bases.values()))  # the bases of new deltas: stored before
        rows = []
        for h, loc in locs.items():
            base = self.new_bases.get(h)
            base_cid = None if base is None or loc.codec not in DELTA_CODECS else cids.get(base)
            if base is not None and loc.codec in DELTA_CODECS and base_cid is None:
                raise Retry(f"the base of chunk {h.hex()[:16]} is gone")
            if base_cid is not None and len(lineage.chain(txn.conn, base_cid)) + 1 > self.read_chain:
                raise Retry(f"the base of chunk {h.hex()[:16]} decodes through more records than planned")
            rows.append((h, loc.seg_id, loc.offset, loc.stored_len, loc.length, loc.codec, first_gen, base_cid))
        txn.conn.executemany("INSERT OR IGNORE INTO chunks(hash, seg_id, offset, stored_len, raw_len, codec, first_gen,"
                             " base_cid) VALUES (?,?,?,?,?,?,?,?)", rows)
        cids.update(_cids(txn.conn, list(locs) + [d.base for d in self.switches if d.base is not None]))
        size = txn.execute("SELECT size FROM contents WHERE content_id=?", (self.content_id,)).fetchone()[0]
        new_body = int(txn.execute("INSERT INTO contents(size, compacted) VALUES (?, 1)", (size,)).lastrowid)
        txn.conn.executemany("INSERT INTO extents VALUES (?,?,?,?)",
                             [(new_body, e.offset, e.length, cids[e.chunk]) for e in self.extents])  # type: ignore[index]
        txn.execute("UPDATE versions SET content_id=? WHERE content_id=?", (new_body, self.content_id))
        txn.execute("UPDATE contents SET compacted=1 WHERE content_id=?", (self.content_id,))
        retired = self._switch(txn, cids)
        ends: dict[int, int] = {}
        for loc in list(locs.values()) + [s.new for s in self.switches]:
            ends[loc.seg_id] = max(ends.get(loc.seg_id, 0), loc.offset + loc.span)
        txn.conn.executemany("UPDATE segments SET committed_end=max(committed_end, ?) WHERE seg_id=?",
                             [(v, k) for k, v in ends.items()])
        lineage.record(txn, [(key, index, self.gen, cids[h]) for key, index, h in self.pieces])
        return retired

    def _switch(self, txn: Txn, cids: dict[bytes, int]) -> list[tuple[int, int, int]]:
        """Point re-encoded chunks at their new records (if their rows still name the records
        that were read); the chain rule is checked again, earlier switches counting."""
        retired = []
        for d in self.switches:
            base = None if d.base is None else cids[d.base]
            if base is not None and not lineage.may_lean_on(txn.conn, d.cid, lineage.chain(txn.conn, base), self.read_chain):
                continue
            changed = txn.execute(
                "UPDATE chunks SET seg_id=?, offset=?, stored_len=?, codec=?, base_cid=? WHERE cid=? AND seg_id=?"
                " AND offset=? AND base_cid IS NULL",
                (d.new.seg_id, d.new.offset, d.new.stored_len, d.new.codec, base, d.cid, d.old.seg_id,
                 d.old.offset)).rowcount
            if changed:
                retired.append((d.old.seg_id, d.old.offset, d.old.stored_len))
                self.report.rewritten += 1
                if base is None:
                    self.report.regrouped += 1
                else:
                    self.report.deltas += 1
                    self.report.delta_saved_bytes += d.saved
        return retired


def extents_and_name(conn: sqlite3.Connection, content_id: int) -> tuple[list[Extent], int, str] | None:
    """A body's extents, size and the name of a file that has it (the format hint); None if
    the body is gone."""
    row = conn.execute("SELECT size FROM contents WHERE content_id=?", (content_id,)).fetchone()
    if row is None:
        return None
    name_row = conn.execute("SELECT d.name FROM versions v JOIN dentries d ON d.ino = v.ino WHERE v.content_id=?"
                            " ORDER BY d.birth_gen DESC LIMIT 1", (content_id,)).fetchone()
    name = bytes(name_row[0]).decode(errors="replace") if name_row else ""
    return load_extents(conn, content_id), int(row[0]), name


def _known(conn: sqlite3.Connection, cid: int) -> _Known | None:
    row = conn.execute(f"SELECT hash, {LOCATION_COLS} FROM chunks WHERE cid=?", (cid,)).fetchone()
    return None if row is None else _Known(cid, bytes(row[0]), location(*row[1:]), lineage.chain(conn, cid))


def _cids(conn: sqlite3.Connection, hashes: list[bytes]) -> dict[bytes, int]:
    out: dict[bytes, int] = {}
    for i in range(0, len(hashes), 500):
        part = hashes[i:i + 500]
        for h, cid in conn.execute("SELECT hash, cid FROM chunks WHERE hash IN (%s)" % ",".join("?" * len(part)), part):
            out[bytes(h)] = cid
    return out


def _batches(spans: list[Span]) -> list[list[Span]]:
    out: list[list[Span]] = []
    cur: list[Span] = []
    n = 0
    for s in spans:
        if cur and n + s.length > BATCH_BYTES:
            out.append(cur)
            cur, n = [], 0
        cur.append(s)
        n += s.length
    if cur:
        out.append(cur)
    return out
