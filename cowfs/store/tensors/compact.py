"""The compactor: committed checkpoint files re-cut into tensor pieces, the newest stored raw
and older ones byte-grouped and compressed or as deltas against the next newer checkpoint
(docs/design.md, "Compaction").

A close() commits chunks stored raw: content-defined ones, and for a safetensors file its
tensor pieces, which the save cuts as they are written (write_layout.py). Later (`cowfs compact`, or the daemon when idle) every body not yet compacted is
done, **newest first**, so that in a backlog each older piece is written once, already as
a delta against the newer one (compact_body.py does one body):

1. read back (verified) and cut by pieces.plan: tensor pieces of recognised formats
   (formats/), content-defined chunks for the rest;
2. a tensor piece not stored yet is appended raw if no compacted body after it has the
   same piece of the same tensor (the lineage, lineage.py): it is the newest, and a
   resume reads it at disk speed; otherwise it is encoded in a worker thread as a delta
   against that newer piece (if the chain rule and DELTA_MAX_SHARE allow) or grouped and
   compressed whole. Other chunks are encoded whole; those already stored are shared
   (dedup stays global);
3. the piece of the nearest compacted body before it, if it is whole and no body still
   waiting lies between them, is re-encoded as a delta against the new piece (or, if it
   was raw, grouped whole); a raw piece a newer body shares unchanged (a frozen tensor) is
   grouped too; a piece the save stored raw that has a newer neighbour is re-encoded as
   step 2 would have encoded it had it been new; each new record is appended as a record
   of its chunk id;
4. the log is synced, then one catalog transaction adds the new chunks, a new body with
   the new extents, points every version of the old body at it, switches each re-encoded
   chunk to its new record, and records the body's pieces in the lineage. The old body,
   its chunks and the replaced records become garbage for gc (holds.py keeps records open
   readers still use).

A crash before step 4's commit leaves records nothing names (recovery cuts them or gc
punches them); after it, the new state is whole. No generation is spent: every version
reads the same bytes before and after.
"""
from __future__ import annotations

import os
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Callable

from ...errors import CorruptData
from .compact_body import Body, CompactReport, Retry, body_regions, extents_and_name
from .recent import RecentPieces
from .formats import TensorRegion
from .lineage import tensor_key

if TYPE_CHECKING:
    from ..parts import BodyReading

Progress = Callable[[int, int], None]


def pending(conn: sqlite3.Connection) -> list[tuple[int, int, int]]:
    """(body, size, generation) of every body some version uses that is not compacted yet,
    newest first; a body's generation is the smallest data_gen of its versions."""
    return conn.execute(
        "SELECT c.content_id, c.size, min(v.data_gen) FROM contents c JOIN versions v ON v.content_id = c.content_id"
        " WHERE c.compacted = 0 GROUP BY c.content_id ORDER BY min(v.data_gen) DESC, c.content_id DESC"
    ).fetchall()


def compact(store: "BodyReading", progress: Progress | None = None, stop: Callable[[], bool] | None = None,
            workers: int | None = None) -> CompactReport:
    """Compact every pending body; `stop()` is asked between steps (the body in hand is then
    left as it was)."""
    t0 = time.monotonic()
    report = CompactReport()
    todo = store.catalog.read(pending)
    total = sum(size for _, size, _ in todo)
    done = 0
    found = _tensors(store, todo, stop)
    if found is None:  # stopped while finding the tensors: nothing was changed
        report.stopped = True
        report.seconds = time.monotonic() - t0
        return report
    waiting = _waiting(todo, found)
    recent = RecentPieces()
    with ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 2, thread_name_prefix="cowfs-compact") as pool, \
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="cowfs-compact-append") as writer:
        for content_id, size, gen in todo:
            for gens in waiting.values():  # this body no longer waits
                if gens and gens[-1] == gen:
                    gens.pop()
            if stop is not None and stop():
                report.stopped = True
                break
            try:
                finished = Body(store, pool, content_id, gen, report, stop, recent, waiting,
                                found.pop(content_id, None), writer).run()
            except Retry as e:  # the catalog changed under it (a repair): the next run does it
                report.errors.append(f"body {content_id}: not compacted this time ({e})")
                continue
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


def _tensors(store: "BodyReading", todo: list[tuple[int, int, int]],
             stop: Callable[[], bool] | None) -> dict[int, list[TensorRegion]] | None:
    """The tensors of each pending body (a body that cannot be read has none here; its own
    step finds and reports the damage). Only headers and directories are read. None if
    `stop()` said so before the end (the run must not go on with part of them)."""
    out: dict[int, list[TensorRegion]] = {}
    for content_id, _size, _gen in todo:
        if stop is not None and stop():
            return None
        with store.index.gc_lock.shared():
            loaded = store.catalog.read(lambda conn: extents_and_name(conn, content_id))
            if loaded is None:
                continue
            release = store.holds.hold(content_id)
        try:
            extents, size, name = loaded
            with store.body_reader(extents, size) as reader:
                out[content_id] = body_regions(reader, size, name)
        except CorruptData:
            continue
        finally:
            release()
    return out


def _waiting(todo: list[tuple[int, int, int]], found: dict[int, list[TensorRegion]]) -> dict[bytes, list[int]]:
    """For each tensor key in the pending bodies, their generations, oldest first (so the
    last is the newest body still waiting). Step 3 leaves an older piece alone while a
    waiting body between it and the new piece has the tensor: that body will be its
    neighbour."""
    out: dict[bytes, list[int]] = {}
    for content_id, _size, gen in reversed(todo):
        for r in found.get(content_id, []):
            gens = out.setdefault(tensor_key(r.name, r.dtype, r.shape), [])
            if not gens or gens[-1] != gen:
                gens.append(gen)
    return out
