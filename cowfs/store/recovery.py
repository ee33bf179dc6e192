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

from ..errors import CorruptData
from .catalog.db import Catalog
from .log.evicted import MAP_SUFFIX, RESTORE_SUFFIX, evicted_ids, map_path, read_map
from .log.layout import SEGMENTS_DIR, fsync_dir, segment_path
from .log.log import Log
from .log.records import DATA_START

SPILL_DIR = "tmp"


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
