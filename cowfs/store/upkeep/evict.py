"""Evicting a segment whose records are safely in the bucket (the engine's half; the remote
tier decides when and says where each record is: remote/evict.py).

Under `gc_lock`, held alone (so no write registers records in it and gc does not run meanwhile), a sealed
segment is evicted only when every chunk row in it

* was committed by a generation whose catalog is in the bucket (`max_first_gen`), so the
  bucket's gc counts it as used for as long as the local catalog keeps the row, and
* is held, as the very same record (same stored length and encoding), by a pack.

Then its map is written durably, the file is deleted, and the log reads it from the map.
A crash after the map is written and before the file is gone leaves both; recovery deletes
the file (the map is complete: a sealed segment gains no rows).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from ...errors import CorruptData
from ..catalog.schema import LIVE
from ..log.device import FileSegment, round_up
from ..log.evicted import RESTORE_SUFFIX, EvictionMap, MapEntry, evicted_ids, map_path, read_map, write_map
from ..log.layout import FORMAT_VERSION, fsync_dir, segment_path
from ..log.records import DATA_START, RecordError, check_record, encode_segment_header, record_span

if TYPE_CHECKING:
    from ..parts import Evicting


@dataclass(frozen=True)
class BucketRecord:
    """Where the bucket holds a chunk's record."""

    pack: str  # pack name (hex)
    pack_size: int
    offset: int  # of the record header in the pack
    stored_len: int
    codec: int


Lookup = Callable[[list[bytes]], dict[bytes, list[BucketRecord]]]  # every record of each chunk, best first


def local_segments(store: "Evicting") -> list[tuple[int, int]]:
    """(segment id, bytes it takes on the disk) of every segment file but the heads', oldest first."""
    heads = store.log.head_positions()
    rows = store.catalog.read(lambda c: c.execute("SELECT seg_id FROM segments ORDER BY created_ns, seg_id").fetchall())
    out = []
    for (seg_id,) in rows:
        if seg_id in heads:
            continue
        try:
            st = segment_path(store.root, seg_id).stat()
        except FileNotFoundError:
            continue
        out.append((seg_id, st.st_blocks * 512))
    return out


# stored bytes, per segment, of the chunks the current tree's files read (each chunk once)
_CURRENT_BYTES = (f"SELECT seg_id, sum(stored_len) FROM chunks WHERE cid IN ("
                  f" SELECT e.cid FROM versions v JOIN extents e ON e.content_id = v.content_id"
                  f" WHERE v.death_gen = {LIVE} AND v.content_id IS NOT NULL AND e.cid IS NOT NULL)"
                  f" GROUP BY seg_id")


def eviction_order(store: "Evicting") -> list[tuple[int, int, int]]:
    """(segment id, bytes on the disk, stored bytes of chunks the current tree reads) of every
    segment file but the heads', in the order eviction takes them: first the segments only
    older versions and snapshots read (a resume reads the current tree, so they are the cold
    ones), oldest first; then the rest, those holding the fewest of the current tree's bytes
    first. A delta record's base is not counted (the compactor's deltas read a base too)."""
    current = dict(store.catalog.read(lambda c: c.execute(_CURRENT_BYTES).fetchall()))
    segs = local_segments(store)
    age = {seg_id: k for k, (seg_id, _) in enumerate(segs)}
    out = [(seg_id, size, int(current.get(seg_id, 0))) for seg_id, size in segs]
    out.sort(key=lambda s: (s[2], age[s[0]]))
    return out


def evicted_count(store: "Evicting") -> int:
    return len(evicted_ids(store.root))


def evict_segment(store: "Evicting", seg_id: int, lookup: Lookup, max_first_gen: int) -> str | None:
    """Evict one segment; returns None when it is done, or why it is kept."""
    path = segment_path(store.root, seg_id)
    with store.maintenance, store.index.gc_lock:  # gc punches segments outside gc_lock: not meanwhile
        if seg_id in store.log.head_positions():
            return "it takes appends"
        if not path.exists():
            return "it has no local file"
        _, inflight = store.index.protected()
        if any(s == seg_id for s, _ in inflight):
            return "a write in flight has records in it"
        if any(r[0] == seg_id for r in store.holds.retired_in_use()):
            return "a reader still uses records the compactor moved out of it"

        def rows_of(conn):  # type: ignore[no-untyped-def]
            end = conn.execute("SELECT committed_end FROM segments WHERE seg_id=?", (seg_id,)).fetchone()
            rows = conn.execute("SELECT hash, offset, stored_len, codec, first_gen FROM chunks WHERE seg_id=?"
                                " ORDER BY offset", (seg_id,)).fetchall()
            return end, rows

        end, rows = store.catalog.read(rows_of)
        if end is None:
            return "the catalog does not know it"
        if any(first_gen > max_first_gen for *_, first_gen in rows):
            return "some of its chunks are newer than the catalog in the bucket"
        found = lookup([bytes(r[0]) for r in rows])
        packs: dict[str, int] = {}
        names: list[tuple[str, int]] = []
        entries: list[MapEntry] = []
        for h, offset, stored_len, codec, _ in rows:
            held = found.get(bytes(h))
            if not held:
                return "some of its chunks are not in the bucket"
            rec = next((r for r in held if r.stored_len == stored_len and r.codec == codec), None)
            if rec is None:
                return "the bucket holds some of its chunks in another encoding"
            if rec.pack not in packs:
                packs[rec.pack] = len(names)
                names.append((rec.pack, rec.pack_size))
            entries.append(MapEntry(offset, rec.offset, record_span(stored_len), packs[rec.pack]))
        write_map(store.root, EvictionMap(seg_id, int(end[0]), names, entries))
        # the file goes first, then the log's open copy of it: a read opening it in between
        # either opened it before (dropped next) or finds it gone and reads the map
        os.unlink(path)
        fsync_dir(path.parent)
        store.log.drop_evicted(seg_id)
    return None


def restore_segment(store: "Evicting", seg_id: int) -> int:
    """Fetch an evicted segment back into a local file (each record checked as it is read);
    returns the bytes written. The file is built beside the map (`.seg.restore`), made durable,
    renamed into place and only then is the map deleted; a crash leaves the map in charge
    (recovery deletes the partial file, or a whole file beside its map: evicted again)."""
    emap = read_map(store.root, seg_id)
    if emap is None:
        return 0
    seg = store.log.segment(seg_id)
    created = store.catalog.read(lambda c: c.execute("SELECT created_ns FROM segments WHERE seg_id=?",
                                                      (seg_id,)).fetchone())
    if created is None:
        return 0  # gc deleted it meanwhile
    path = segment_path(store.root, seg_id)
    tmp = path.with_name(path.name + RESTORE_SUFFIX)
    out = FileSegment.create(tmp, round_up(max(emap.committed_end, DATA_START)))
    written = 0
    try:
        out.write(0, encode_segment_header(seg_id, store.config.store_uuid, int(created[0]), FORMAT_VERSION))
        for e in emap.entries:
            rec = seg.read(e.seg_offset, e.span)
            try:
                head, _ = check_record(rec)
                if head.span != e.span:
                    raise RecordError("record span differs from the map's")
            except RecordError as err:
                raise CorruptData(f"segment {seg_id} offset {e.seg_offset} (from the bucket): {err}") from None
            out.write(e.seg_offset, rec)
            written += len(rec)
        out.persist()
    except BaseException:
        out.close()
        tmp.unlink(missing_ok=True)
        raise
    out.close()
    with store.index.gc_lock:
        alive = store.catalog.read(lambda c: c.execute("SELECT 1 FROM segments WHERE seg_id=?", (seg_id,)).fetchone())
        if alive is None:
            tmp.unlink(missing_ok=True)
            return 0
        os.rename(tmp, path)
        fsync_dir(path.parent)
        map_path(store.root, seg_id).unlink()
        fsync_dir(path.parent)
        store.log.drop_evicted(seg_id)
    return written


def restore_all(store: "Evicting", progress: Callable[[int, int], None] | None = None) -> tuple[int, int]:
    """Fetch every evicted segment back; returns (segments, bytes)."""
    ids = sorted(evicted_ids(store.root))
    total = 0
    for k, seg_id in enumerate(ids):
        if progress is not None:
            progress(k, len(ids))
        total += restore_segment(store, seg_id)
    if progress is not None:
        progress(len(ids), len(ids))
    return len(ids), total
