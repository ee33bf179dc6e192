"""Recovery at open: the store as the last committed catalog transaction left it.

Every segment is cut back to its committed end (records appended after the last
commit that names them are garbage of an interrupted write), segments the
catalog does not know or that hold nothing committed are deleted (with their
eviction maps), an eviction a crash interrupted after its map was written is
finished (the local file is deleted: evict.py), and the spill
directory of write sessions is cleared. Each step is idempotent, so a crash
during recovery is recovered by the next open. docs/design.md, "Recovery".
"""
from __future__ import annotations

import shutil
from pathlib import Path

from ..errors import CorruptData, StoreError
from .catalog.db import Catalog
from .log.evicted import MAP_SUFFIX, RESTORE_SUFFIX, evicted_ids, map_path, read_map
from .log.layout import CATALOG_FILE, CONFIG_FILE, SEGMENTS_DIR, fsync_dir, segment_path
from .log.log import Log
from .log.records import DATA_START, RecordError, decode_segment_header

SPILL_DIR = "tmp"


def check_ownership(root: Path, catalog: Catalog, store_uuid: str) -> None:
    """Before recovery cuts or deletes anything (it deletes segment files the catalog does not
    know and cuts the others to their committed end): the catalog must be this store's (its
    meta `store_uuid` the one in cowfs-store.json), and every segment file whose header is
    whole (magic and CRC) must name this store and the number in its file name. A file of
    another store, or one renamed, raises StoreError and nothing is changed. A header that is
    not whole is let be: a crash can leave a new segment's header unwritten (recovery deletes
    such a file, which no commit names), and bit rot in one is fsck's to report (every
    record is checked when it is read)."""
    row = catalog.read(lambda c: c.execute("SELECT value FROM meta WHERE key='store_uuid'").fetchone())
    if row is None or str(row[0]) != store_uuid:
        raise StoreError(f"{root / CATALOG_FILE} is the catalog of store {row[0] if row else '(none)'}, and "
                         f"{root / CONFIG_FILE} names store {store_uuid}: put back this store's own catalog "
                         "(nothing was changed)")
    for path in sorted((root / SEGMENTS_DIR).glob("*.seg")):
        try:
            seg_id = int(path.stem)
            with open(path, "rb") as f:
                header = decode_segment_header(f.read(64))
        except (ValueError, OSError, RecordError):
            continue
        if header.store_uuid != store_uuid:
            raise StoreError(f"{path} is a segment of store {header.store_uuid}, not of this store ({store_uuid}): "
                             "move it back to its own store (nothing was changed)")
        if header.seg_id != seg_id:
            raise StoreError(f"{path} is segment {header.seg_id} of this store under another number: give it back "
                             f"its name, {segment_path(root, header.seg_id).name} (nothing was changed)")


def recover(root: Path, catalog: Catalog, device: str) -> int:
    """Cut every segment back to its committed end; drop files no commit refers to.
    Returns the bytes released."""
    released = 0
    rows = dict(catalog.read(lambda c: c.execute("SELECT seg_id, committed_end FROM segments").fetchall()))
    drop: list[int] = []
    evicted = evicted_ids(root)
    for seg_id, end in rows.items():
        path = segment_path(root, seg_id)
        if end <= DATA_START:
            if path.exists():
                released += path.stat().st_blocks * 512
                path.unlink()
            map_path(root, seg_id).unlink(missing_ok=True)
            drop.append(seg_id)
        elif seg_id in evicted and path.exists():
            try:
                read_map(root, seg_id)  # a whole map: the eviction finishes
            except CorruptData:  # a damaged map beside the file: the file holds it all, the map goes
                map_path(root, seg_id).unlink()
                fsync_dir(path.parent)
                released += Log.recover_segment(path, end, device)
                continue
            released += path.stat().st_blocks * 512
            path.unlink()
            fsync_dir(path.parent)
        elif path.exists():
            released += Log.recover_segment(path, end, device)
    for seg_id in evicted - set(rows):  # gc deleted the segment's row: its map goes too
        map_path(root, seg_id).unlink(missing_ok=True)
    for path in [*(root / SEGMENTS_DIR).glob(f"*{RESTORE_SUFFIX}"),  # a fetch back a crash cut short
                 *(root / SEGMENTS_DIR).glob(f"*{MAP_SUFFIX}.tmp")]:  # a map not yet renamed
        released += path.stat().st_blocks * 512
        path.unlink()
    for path in (root / SEGMENTS_DIR).glob("*.seg"):
        try:
            seg_id = int(path.stem)
        except ValueError:
            continue
        if seg_id not in rows:
            released += path.stat().st_blocks * 512
            path.unlink()
    if drop:
        catalog.write(lambda t: t.conn.executemany("DELETE FROM segments WHERE seg_id=?", [(s,) for s in drop]),
                      op="recover")
    shutil.rmtree(root / SPILL_DIR, ignore_errors=True)
    return released
