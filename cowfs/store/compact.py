"""The compactor: committed checkpoint files re-cut into tensor pieces, stored byte-grouped
and compressed, and superseded pieces turned into deltas (docs/design.md, "Compaction").

The save path is untouched: a close() commits content-defined chunks stored raw, as
before. Later (`cowfs compact`, or the daemon when idle) each body not yet compacted is,
oldest first:

1. read back (verified) and cut by pieces.plan: tensor pieces of recognised formats
   (formats/), content-defined chunks for the rest;
2. tensor pieces not stored yet are appended raw (the newest checkpoint reads at disk
   speed), other chunks encoded (codecs.encode_whole) in worker threads; those already
   stored are shared (dedup stays global);
3. for every tensor piece whose lineage (lineage.py) had a different newest piece, the
   superseded piece is re-encoded in worker threads: as a delta against the new one,
   unless that would make a read touch more than MAX_CHAIN records or save less than a
   tenth (codecs.DELTA_MAX_SHARE), else, if it was raw, grouped and compressed whole; a
   raw piece the new body shares unchanged (a frozen tensor) is grouped and compressed
   too. Each is appended as a new record of its chunk id;
4. the log is synced, then one catalog transaction adds the new chunks, a new body with
   the new extents, points every version of the old body at it, switches each re-encoded
   chunk to its new record, and advances the lineages. The old body, its chunks and the
   replaced records become garbage for gc (holds.py keeps records open readers still use).

A crash before step 4's commit leaves records nothing names (recovery cuts them or gc
punches them); after it, the new state is whole. No generation is spent: every version
reads the same bytes before and after.
"""
from __future__ import annotations

import os
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from ..errors import CorruptData
from . import lineage
from .catalog import Txn
from .chunking import chunk_id, cut_all
from .codecs import CODEC_RAW, DELTA_CODECS, Encoded, encode_delta, encode_whole
from .content import Extent, load_extents
from .formats import regions
from .log import LOCATION_COLS, Location, location
from .pieces import Span, plan

if TYPE_CHECKING:
    from .store import Store

BATCH_BYTES = 64 << 20  # bytes read, hashed and encoded per step
HEAD_BYTES = 64 << 10
Progress = Callable[[int, int], None]


@dataclass
class CompactReport:
    bodies: int = 0  # bodies looked at
    recut: int = 0  # bodies re-cut into tensor pieces
    logical_bytes: int = 0  # bytes of the bodies looked at
    pieces: int = 0  # tensor pieces in the re-cut bodies
    new_chunks: int = 0  # pieces and chunks stored for the first time
    new_stored_bytes: int = 0  # their payload bytes
    deltas: int = 0  # superseded pieces re-encoded as deltas
    regrouped: int = 0  # raw pieces (superseded, or shared by a newer body) grouped and compressed whole
    delta_saved_bytes: int = 0  # stored bytes those deltas saved
    stopped: bool = False  # interrupted before every body was done
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)


@dataclass
class _Piece:
    span: Span
    chunk: bytes


@dataclass
class _Delta:
    cid: int  # the superseded piece, re-encoded
    old: Location
    new: Location
    base: bytes | None  # the id of the piece it is now a delta against (one of this body's); None: whole
    saved: int


@dataclass(frozen=True)
class _Job:
    cid: int  # the superseded piece
    chunk: bytes
    loc: Location
    base: bytes | None  # the new piece, if the superseded one may become a delta against it
    base_raw: memoryview | None
    elem_size: int


def pending(conn: sqlite3.Connection) -> list[tuple[int, int]]:
    """(body, size) of every body some version uses that is not compacted yet, oldest first."""
    return conn.execute(
        "SELECT c.content_id, c.size FROM contents c JOIN versions v ON v.content_id = c.content_id"
        " WHERE c.compacted = 0 GROUP BY c.content_id ORDER BY min(v.data_gen), c.content_id"
    ).fetchall()


def compact(store: "Store", progress: Progress | None = None, stop: Callable[[], bool] | None = None,
            workers: int | None = None) -> CompactReport:
    """Compact every pending body; `stop()` is asked between steps (the body in hand is then
    left as it was)."""
    t0 = time.monotonic()
    report = CompactReport()
    todo = store.catalog.read(pending)
    total = sum(size for _, size in todo)
    done = 0
    with ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 2, thread_name_prefix="cowfs-compact") as pool:
        for content_id, size in todo:
            if stop is not None and stop():
                report.stopped = True
                break
            try:
                finished = _Body(store, pool, content_id, report, stop).run()
            except CorruptData as e:  # a damaged body stays as it is (fsck names it); the others go on
                report.errors.append(f"body {content_id}: not compacted ({e})")
                continue
            if not finished:
                report.stopped = True
                break
            done += size
            if progress is not None:
                progress(done, total)
    report.seconds = time.monotonic() - t0
    return report


class _Body:
    """One body's compaction (steps 1-4 of the module doc)."""

    def __init__(self, store: "Store", pool: ThreadPoolExecutor, content_id: int, report: CompactReport,
                 stop: Callable[[], bool] | None) -> None:
        self.store, self.pool, self.content_id, self.report, self.stop = store, pool, content_id, report, stop
        self.pinned: list[bytes] = []
        self.pieces: list[_Piece] = []
        self.extents: list[Extent] = []  # the new body's, locations of chunks appended or known
        self.deltas: list[_Delta] = []
        self.superseded: set[int] = set()

    def run(self) -> bool:
        """False when stopped before the end (nothing changed)."""
        store = self.store
        with store.index.gc_lock:
            extents, size, name = store.catalog.read(self._load)
            release = store.holds.hold(self.content_id)
        try:
            self.report.bodies += 1
            self.report.logical_bytes += size
            reader = store.body_reader(extents, size)
            try:
                found = regions(bytes(reader.read(0, HEAD_BYTES)), size, lambda o, n: bytes(reader.read(o, n)), name)
                spans = plan(size, found) if found else []
                if not any(s.key is not None for s in spans):
                    store.catalog.write(self._mark_done, op="compact")
                    return True
                for batch in _batches(spans):
                    if self.stop is not None and self.stop():
                        return False
                    self._store_batch(reader, batch)
            finally:
                reader.close()
            store.log.sync()
            with store.index.gc_lock:
                retired = store.catalog.write(self._commit, op="compact")
                store.holds.retire(retired)
            self.report.recut += 1
            return True
        finally:
            store.index.unpin(self.pinned)
            release()

    def _load(self, conn: sqlite3.Connection) -> tuple[list[Extent], int, str]:
        size = conn.execute("SELECT size FROM contents WHERE content_id=?", (self.content_id,)).fetchone()[0]
        row = conn.execute("SELECT d.name FROM versions v JOIN dentries d ON d.ino = v.ino WHERE v.content_id=?"
                           " ORDER BY d.birth_gen DESC LIMIT 1", (self.content_id,)).fetchone()
        name = bytes(row[0]).decode(errors="replace") if row else ""
        return load_extents(conn, self.content_id), int(size), name

    def _mark_done(self, txn: Txn) -> None:
        txn.execute("UPDATE contents SET compacted=1 WHERE content_id=?", (self.content_id,))

    # -- steps 1 and 2 ------------------------------------------------------------------

    def _store_batch(self, reader, batch: list[Span]) -> None:  # type: ignore[no-untyped-def]
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
        ids = list(self.pool.map(lambda sv: chunk_id(sv[1]), cut))
        self.pinned.extend(ids)
        known = self.store.index.pin(ids)
        fresh: dict[bytes, tuple[memoryview, int]] = {}
        for (s, view), h in zip(cut, ids):
            if h not in known and h not in fresh:
                fresh[h] = (view, s.elem_size)
        items = list(fresh.items())
        keyed = {h for (s, _v), h in zip(cut, ids) if s.key is not None}
        encoded = list(self.pool.map(
            lambda it: Encoded(CODEC_RAW, it[1][0]) if it[0] in keyed else encode_whole(it[1][0], it[1][1]), items))
        records = [(h, e.payload, len(v), e.codec) for (h, (v, _)), e in zip(items, encoded)]
        locs = self.store.log.append_records(records) if records else []
        for (h, *_), loc in zip(records, locs):
            self.store.index.add_location(h, loc)
            known[h] = loc
            self.report.new_chunks += 1
            self.report.new_stored_bytes += loc.stored_len
        for (s, view), h in zip(cut, ids):
            self.extents.append(Extent(s.offset, s.length, h, known[h]))
            if s.key is not None:
                self.pieces.append(_Piece(s, h))
                self.report.pieces += 1
        self._supersede([(s, view, h) for (s, view), h in zip(cut, ids) if s.key is not None])
    # -- step 3 ---------------------------------------------------------------------------

    def _supersede(self, pieces: list[tuple[Span, memoryview, bytes]]) -> None:
        """Re-encode the pieces these supersede as deltas against them (while their bytes
        are at hand)."""
        jobs = self.store.catalog.read(lambda conn: self._delta_jobs(conn, pieces))
        if not jobs:
            return
        self.pinned.extend(j.chunk for j in jobs)
        self.store.index.pin([j.chunk for j in jobs])
        results = list(self.pool.map(self._reencode, jobs))
        good = [(job, enc) for job, enc in zip(jobs, results) if enc is not None]
        if not good:
            return
        locs = self.store.log.append_records([(j.chunk, enc.payload, j.loc.length, enc.codec) for j, enc in good])
        for (job, enc), loc in zip(good, locs):
            self.store.index.add_location(job.chunk, loc)
            self.deltas.append(_Delta(job.cid, job.loc, loc, enc.base, job.loc.stored_len - loc.stored_len))

    def _delta_jobs(self, conn: sqlite3.Connection, pieces: list[tuple[Span, memoryview, bytes]]) -> list[_Job]:
        """A job for each lineage's previous newest piece (seen once): a whole record of the
        same length that may become a delta if the chain rule of lineage.may_lean_on holds,
        or, if it is raw, is to be grouped whatever (superseded, or shared unchanged)."""
        jobs = []
        for span, view, h in pieces:
            assert span.key is not None
            q = lineage.lookup(conn, span.key, span.index)
            if q is None or q in self.superseded:
                continue
            row = conn.execute(f"SELECT hash, {LOCATION_COLS} FROM chunks WHERE cid=?", (q,)).fetchone()
            if row is None:
                continue
            loc = location(*row[1:])
            if loc.codec in DELTA_CODECS or loc.length != len(view):
                continue
            lean = False
            if bytes(row[0]) != h:
                p = conn.execute("SELECT cid FROM chunks WHERE hash=?", (h,)).fetchone()
                p_chain = lineage.chain(conn, p[0]) if p else [-1]  # a new piece: one whole record
                lean = lineage.may_lean_on(conn, q, p_chain)
            if not lean and loc.codec != CODEC_RAW:
                continue
            self.superseded.add(q)
            jobs.append(_Job(q, bytes(row[0]), loc, h if lean else None, view if lean else None, span.elem_size))
        return jobs

    def _reencode(self, job: _Job) -> Encoded | None:
        """The piece's new record: a delta if allowed and small enough, else (a raw piece)
        grouped whole; None to keep the record it has."""
        try:
            raw = self.store.log.read_chunk(job.loc, job.chunk)
        except Exception as e:  # a damaged piece stays as it is; fsck reports it
            self.report.errors.append(f"chunk {job.chunk.hex()[:16]}: not re-encoded ({e})")
            return None
        whole = encode_whole(raw, job.elem_size) if job.loc.codec == CODEC_RAW else None
        if job.base is not None and job.base_raw is not None:
            delta = encode_delta(raw, job.elem_size, job.base, job.base_raw,
                                 whole.stored_len if whole is not None else job.loc.stored_len)
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
            locs.setdefault(e.chunk, e.loc)  # type: ignore[arg-type]
        txn.conn.executemany(
            "INSERT OR IGNORE INTO chunks(hash, seg_id, offset, stored_len, raw_len, codec, first_gen) VALUES (?,?,?,?,?,?,?)",
            [(h, l.seg_id, l.offset, l.stored_len, l.length, l.codec, first_gen) for h, l in locs.items()])
        cids: dict[bytes, int] = {}
        hashes = list(locs)
        for i in range(0, len(hashes), 500):
            part = hashes[i:i + 500]
            for h, cid in txn.execute("SELECT hash, cid FROM chunks WHERE hash IN (%s)" % ",".join("?" * len(part)), part):
                cids[bytes(h)] = cid
        size = txn.execute("SELECT size FROM contents WHERE content_id=?", (self.content_id,)).fetchone()[0]
        new_body = int(txn.execute("INSERT INTO contents(size, compacted) VALUES (?, 1)", (size,)).lastrowid)
        txn.conn.executemany("INSERT INTO extents VALUES (?,?,?,?)",
                             [(new_body, e.offset, e.length, cids[e.chunk]) for e in self.extents])  # type: ignore[index]
        txn.execute("UPDATE versions SET content_id=? WHERE content_id=?", (new_body, self.content_id))
        txn.execute("UPDATE contents SET compacted=1 WHERE content_id=?", (self.content_id,))
        retired = []
        ends: dict[int, int] = {}
        for loc in list(locs.values()) + [d.new for d in self.deltas]:
            ends[loc.seg_id] = max(ends.get(loc.seg_id, 0), loc.offset + loc.span)
        for d in self.deltas:  # checked again here: earlier switches in this loop count too
            base = None if d.base is None else cids[d.base]
            if base is not None and not lineage.may_lean_on(txn.conn, d.cid, lineage.chain(txn.conn, base)):
                continue
            changed = txn.execute(
                "UPDATE chunks SET seg_id=?, offset=?, stored_len=?, codec=?, base_cid=? WHERE cid=? AND seg_id=?"
                " AND offset=? AND base_cid IS NULL",
                (d.new.seg_id, d.new.offset, d.new.stored_len, d.new.codec, base, d.cid, d.old.seg_id,
                 d.old.offset)).rowcount
            if changed:
                retired.append((d.old.seg_id, d.old.offset, d.old.stored_len))
                if base is None:
                    self.report.regrouped += 1
                else:
                    self.report.deltas += 1
                    self.report.delta_saved_bytes += d.saved
        txn.conn.executemany("UPDATE segments SET committed_end=max(committed_end, ?) WHERE seg_id=?",
                             [(v, k) for k, v in ends.items()])
        for p in self.pieces:
            key = p.span.key
            assert key is not None
            if lineage.lookup(txn.conn, key, p.span.index) != cids[p.chunk]:
                lineage.advance(txn, key, p.span.index, cids[p.chunk])
        return retired


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

