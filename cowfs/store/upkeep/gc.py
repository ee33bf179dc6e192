"""Garbage collection: delete chunks no retained version references, punch their space.

1. Under `gc_lock`, held alone (writers pin chunks and append and register
   records holding it shared, so none is doing so meanwhile), one
   catalog transaction deletes bodies no version references (unless an open
   reader holds them) and chunks no body references (unless pinned).
2. Still under the lock, for every segment, the gaps between the records the
   catalog or an open session still uses are computed: dead chunks, and
   garbage of writes a crash interrupted. Each head segment (those taking
   appends) is only considered up to its append position.
3. Outside the lock the gaps are punched (fallocate PUNCH_HOLE) and segments
   with nothing live left are deleted (row first, then the file; recovery
   deletes a file whose row is gone). Punching is idempotent, so a crash
   anywhere leaves at worst unpunched garbage that the next gc reclaims.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from ..catalog.db import Txn
from ..log.device import round_up
from ..log.evicted import map_path
from ..log.layout import segment_path
from ..log.records import DATA_START, record_span
from ..tensors.lineage import forget_dead_pieces

if TYPE_CHECKING:
    from ..parts import Collecting


@dataclass(frozen=True)
class GcReport:
    chunks_deleted: int
    bytes_deleted: int  # stored bytes of the deleted chunks
    segments_deleted: int
    physical_before: int
    physical_after: int
    seconds: float

    @property
    def bytes_freed(self) -> int:
        return max(self.physical_before - self.physical_after, 0)


def collect(store: "Collecting", progress: Callable[[int, int], None] | None = None) -> GcReport:
    t0 = time.monotonic()
    before = store.physical_bytes()
    with store.index.gc_lock:
        pinned, inflight = store.index.protected()
        open_contents = store.holds.contents()
        retired = store.holds.retired_in_use()

        def fn(txn: Txn) -> tuple[int, int]:
            txn.execute("CREATE TEMP TABLE IF NOT EXISTS gc_keep_content(content_id INTEGER PRIMARY KEY)")
            txn.execute("DELETE FROM gc_keep_content")
            txn.conn.executemany("INSERT INTO gc_keep_content VALUES (?)", [(c,) for c in open_contents])
            txn.execute(
                "DELETE FROM extents WHERE content_id IN (SELECT content_id FROM contents c WHERE"
                " NOT EXISTS (SELECT 1 FROM versions v WHERE v.content_id = c.content_id)"
                " AND c.content_id NOT IN (SELECT content_id FROM gc_keep_content))"
            )
            txn.execute(
                "DELETE FROM contents WHERE NOT EXISTS (SELECT 1 FROM versions v WHERE v.content_id = contents.content_id)"
                " AND content_id NOT IN (SELECT content_id FROM gc_keep_content)"
            )
            txn.execute("CREATE TEMP TABLE IF NOT EXISTS gc_pinned(hash BLOB PRIMARY KEY)")
            txn.execute("DELETE FROM gc_pinned")
            txn.conn.executemany("INSERT OR IGNORE INTO gc_pinned VALUES (?)", [(h,) for h in pinned])
            # kept: chunks a body uses or a writer pinned, and the delta bases they decode from
            dead = txn.execute(
                "WITH RECURSIVE keep(cid) AS (SELECT cid FROM extents WHERE cid IS NOT NULL"
                " UNION SELECT cid FROM chunks WHERE hash IN (SELECT hash FROM gc_pinned)"
                " UNION SELECT c.base_cid FROM chunks c JOIN keep k ON c.cid = k.cid WHERE c.base_cid IS NOT NULL)"
                " SELECT cid, stored_len FROM chunks WHERE cid NOT IN (SELECT cid FROM keep)"
            ).fetchall()
            txn.conn.executemany("DELETE FROM chunks WHERE cid=?", [(cid,) for cid, _ in dead])
            forget_dead_pieces(txn)
            return len(dead), sum(n for _, n in dead)

        n_dead, dead_bytes = store.catalog.write(fn, op="gc")
        heads = store.log.head_positions()

        def plan(conn):  # type: ignore[no-untyped-def]
            segs = conn.execute("SELECT seg_id, committed_end FROM segments ORDER BY seg_id").fetchall()
            out = []
            for seg_id, committed_end in segs:
                live = conn.execute(
                    "SELECT offset, stored_len FROM chunks WHERE seg_id=? ORDER BY offset", (seg_id,)
                ).fetchall()
                out.append((seg_id, committed_end, live))
            return out

        segments = store.catalog.read(plan)
        punches: list[tuple[int, list[tuple[int, int]]]] = []
        empty: list[int] = []
        for seg_id, committed_end, live in segments:
            extra = [(off, 0) for (s, off) in inflight if s == seg_id]
            used = sorted([(off, record_span(n)) for off, n in live]
                          + [(off, _span_of(store, seg_id, off)) for off, _ in extra]
                          + [(off, record_span(n)) for s, off, n in retired if s == seg_id])
            if seg_id in heads:
                limit = heads[seg_id]
            else:
                path = segment_path(store.root, seg_id)
                limit = path.stat().st_size if path.exists() else 0  # 0: evicted (or missing), nothing to punch
            if not used and seg_id not in heads:
                empty.append(seg_id)
                continue
            gaps: list[tuple[int, int]] = []
            pos = DATA_START
            for off, span in used + [(limit, 0)]:
                if off > pos:
                    gaps.append((pos, off - pos))
                pos = max(pos, off + span)
            punches.append((seg_id, gaps))

    for done, (seg_id, gaps) in enumerate(punches):
        if progress is not None:
            progress(done, len(punches))
        if not gaps:
            continue
        if not segment_path(store.root, seg_id).exists():
            continue  # a missing segment is fsck's business; nothing to reclaim there
        seg = store.log.segment(seg_id)
        for off, length in gaps:
            _clear(seg, off, length)
    if progress is not None:
        progress(len(punches), len(punches))
    if empty:
        store.catalog.write(
            lambda t: t.conn.executemany("DELETE FROM segments WHERE seg_id=?", [(s,) for s in empty]), op="gc"
        )
        for seg_id in empty:
            store.log.forget_segment(seg_id)
            segment_path(store.root, seg_id).unlink(missing_ok=True)
            map_path(store.root, seg_id).unlink(missing_ok=True)  # an evicted one's map
    store.catalog.refill_reserve()  # the catalog's room for freeing changes on a full device
    after = store.physical_bytes()
    return GcReport(n_dead, dead_bytes, len(empty), before, after, time.monotonic() - t0)


def _clear(seg, off: int, length: int) -> None:  # type: ignore[no-untyped-def]
    """Give dead bytes back: whole pages are punched, the partial pages at the edges are zeroed."""
    lo, hi = round_up(off), (off + length) // 4096 * 4096
    if hi > lo:
        seg.punch(lo, hi - lo)
        if lo > off:
            seg.write(off, bytes(lo - off))
        if off + length > hi:
            seg.write(hi, bytes(off + length - hi))
    else:
        seg.write(off, bytes(length))


def _span_of(store: "Collecting", seg_id: int, offset: int) -> int:
    """Span of an in-flight record, read from its header."""
    from ..log.records import HEADER_SIZE, decode_record_header

    head = decode_record_header(store.log.segment(seg_id).read(offset, HEADER_SIZE))
    return head.span
