"""The commit transaction of a file's new version, and the events it publishes.

The caller (Store) has made the version's data records durable first (log.sync);
this transaction then names them: new chunk rows (first_gen = this generation),
a new body (contents + extents), the segments' committed ends, and the file's
new live version row. One transaction: a crash before it leaves the previous
version and unreferenced records that recovery cuts off or gc punches.
"""
from __future__ import annotations

from ...errors import NotFound
from ..catalog import events as ev
from ..catalog import namespace as ns
from ..catalog.db import Txn
from ..catalog.events import Event
from ..catalog.history import added_bytes
from ..catalog.namespace import Attr
from ..log.log import LOCATION_COLS, Location, location
from .content import Extent

_IN_BATCH = 500  # SQLite's bound on host parameters is 999 in old builds


def commit_version(txn: Txn, ino: int, size: int, mtime_ns: int | None,
                   extents: list[Extent]) -> tuple[Attr | None, list[Extent]]:
    """Commit `extents` (chunks with the locations they were appended at, or holes) as the
    new body of `ino`; returns its new attributes and the extents with each chunk's catalog
    location (an already stored identical chunk wins). (None, extents) if the file is gone."""
    try:
        row = ns.live_version(txn, ino)
    except NotFound:  # removed while written: nothing to commit to
        return None, extents
    locs: dict[bytes, Location] = {}
    for e in extents:
        if e.chunk is not None and e.loc is not None:
            locs.setdefault(e.chunk, e.loc)
    before = txn.conn.total_changes
    txn.conn.executemany(
        "INSERT OR IGNORE INTO chunks(hash, seg_id, offset, stored_len, raw_len, codec, first_gen) VALUES (?,?,?,?,?,?,?)",
        [(h, l.seg_id, l.offset, l.stored_len, l.stored_len if l.raw_len is None else l.raw_len, l.codec, txn.gen)
         for h, l in locs.items()],
    )
    cids = _new_cids(txn, locs, txn.conn.total_changes - before) or _stored_cids(txn, list(locs))
    content_id = int(txn.execute("INSERT INTO contents(size) VALUES (?)", (size,)).lastrowid)
    stored: list[Extent] = []
    rows = []
    for e in extents:
        if e.chunk is None:
            rows.append((content_id, e.offset, e.length, None))
            stored.append(e)
        else:
            cid, loc = cids[e.chunk]
            rows.append((content_id, e.offset, e.length, cid))
            stored.append(e if e.loc == loc else Extent(e.offset, e.length, e.chunk, loc))
    txn.conn.executemany("INSERT INTO extents VALUES (?,?,?,?)", rows)
    last: dict[int, Location] = {}  # per segment, its record that starts last (records do not overlap)
    for _cid, loc in cids.values():
        seen = last.get(loc.seg_id)
        if seen is None or loc.offset > seen.offset:
            last[loc.seg_id] = loc
    ends = {seg: loc.offset + loc.span for seg, loc in last.items()}
    txn.conn.executemany(
        "UPDATE segments SET committed_end=max(committed_end, ?) WHERE seg_id=?", [(v, k) for k, v in ends.items()]
    )
    mtime = mtime_ns if mtime_ns is not None else txn.now_ns
    ns.new_version(txn, row, size=size, mtime_ns=mtime, ctime_ns=txn.now_ns, content_id=content_id, data_gen=txn.gen)
    return ns.getattr_(txn.conn, ino, txn.gen), stored


def _new_cids(txn: Txn, locs: dict[bytes, Location], inserted: int) -> dict[bytes, tuple[int, Location]] | None:
    """When the INSERT OR IGNORE just now added a row for every chunk (none was stored
    already), their cids without a query per chunk: an INTEGER PRIMARY KEY given by SQLite
    is one more than the largest, so one statement's rows get consecutive cids in order
    (checked at both ends). None where that does not hold: look them up."""
    n = len(locs)
    if not n or inserted != n:
        return None
    # one query, as many as the lookup a one-chunk commit would make
    last, first_hash, last_hash = txn.execute(
        "SELECT last_insert_rowid(), (SELECT hash FROM chunks WHERE cid = last_insert_rowid() - ?),"
        " (SELECT hash FROM chunks WHERE cid = last_insert_rowid())", (n - 1,)).fetchone()
    first = int(last) - n + 1
    hashes = list(locs)
    if first_hash is None or bytes(first_hash) != hashes[0] or last_hash is None or bytes(last_hash) != hashes[-1]:
        return None
    return {h: (first + i, loc) for i, (h, loc) in enumerate(locs.items())}


def _stored_cids(txn: Txn, hashes: list[bytes]) -> dict[bytes, tuple[int, Location]]:
    """Each chunk's cid and the location of its catalog row (an identical chunk stored
    before wins over the record this session appended)."""
    cids: dict[bytes, tuple[int, Location]] = {}
    for i in range(0, len(hashes), _IN_BATCH):
        part = hashes[i:i + _IN_BATCH]
        q = f"SELECT hash, cid, {LOCATION_COLS} FROM chunks WHERE hash IN (%s)" % ",".join("?" * len(part))
        for h, cid, *loc in txn.execute(q, part):
            cids[bytes(h)] = (cid, location(*loc))
    return cids


def version_events(txn: Txn, attr: Attr | None) -> list[Event]:
    """A `version` event for each path of a file whose new body this transaction committed."""
    if attr is None or attr.content_id is None:
        return []
    added = added_bytes(txn.conn, txn.gen, attr.content_id)
    return [Event(ev.VERSION, txn.gen, txn.now_ns, path, size=attr.size, added_bytes=added)
            for path in ns.paths_of(txn.conn, attr.ino, txn.gen)]


def path_in(txn: Txn, parent: int, name: bytes) -> str:
    """The path of entry `name` of directory `parent` in this transaction's tree (for events)."""
    head = ns.paths_of(txn.conn, parent, txn.gen)
    return f"{head[0].rstrip('/') if head else ''}/{name.decode(errors='replace')}"
