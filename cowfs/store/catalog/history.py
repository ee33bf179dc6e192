"""A file's history (its content versions) and the expiry of history no snapshot holds."""
from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Iterable

from . import namespace as ns
from .db import Txn
from .schema import LIVE, ROOT_INO


@dataclass(frozen=True)
class VersionInfo:
    vid: int
    birth_gen: int
    death_gen: int | None  # None while current
    time_ns: int
    size: int
    mode: int
    added_bytes: int  # bytes of chunks this version's commit stored for the first time
    added_stored_bytes: int  # the same chunks' record payloads, as encoded now


def added(conn: sqlite3.Connection, gen: int, content_id: int) -> tuple[int, int]:
    """Bytes of the chunks of body `content_id` that the commit at `gen` stored first:
    (decoded, as stored in their records now)."""
    raw, stored = conn.execute(
        "SELECT coalesce(sum(raw_len), 0), coalesce(sum(stored_len), 0) FROM chunks WHERE first_gen=? AND cid IN"
        " (SELECT cid FROM extents WHERE content_id=?)",
        (gen, content_id),
    ).fetchone()
    return int(raw), int(stored)


def added_bytes(conn: sqlite3.Connection, gen: int, content_id: int) -> int:
    return added(conn, gen, content_id)[0]


def history(conn: sqlite3.Connection, target: int | str | bytes) -> list[VersionInfo]:
    """Content versions, newest first, of an inode or of a path (across every inode
    that was ever named so: write-to-temp-then-rename keeps one history). A version is a
    row that committed a body (data_gen = birth_gen); the rows after it that only change
    metadata (chmod, rename, link...) belong to it, so it lasts until its body is replaced.
    A live metadata-only row whose body's row is not there (a rename that gave a file being
    written the body it replaced, or an expired row) is shown by itself."""
    inos = [target] if isinstance(target, int) else ns.inodes_ever_at(conn, target)
    rows = conn.execute(
        "SELECT v.ino, v.data_gen, v.vid, v.birth_gen, v.death_gen, g.time_ns, g.op, v.size, v.mode, v.content_id"
        " FROM versions v LEFT JOIN generations g ON g.gen = v.birth_gen"
        " WHERE v.ino IN (%s) ORDER BY v.ino, v.birth_gen" % ",".join("?" * len(inos)),
        inos,
    ).fetchall()
    body_death: dict[tuple[int, int], int] = {}
    for ino, data_gen, _vid, _birth, death, *_ in rows:
        body_death[(ino, data_gen)] = death  # rows come in birth order: the last one's death
    shown: set[tuple[int, int]] = set()
    out = []
    for ino, data_gen, vid, birth, death, t, op, size, mode, content_id in rows:
        if data_gen == birth:
            death = body_death[(ino, data_gen)]
            if size == 0 and op == "create" and death != LIVE:
                continue  # the empty body a create makes before the first write is not a version anyone saved
            shown.add((ino, data_gen))
        elif death != LIVE or (ino, data_gen) in shown:
            continue
        new, stored = added(conn, data_gen, content_id) if content_id is not None and data_gen == birth else (0, 0)
        out.append(VersionInfo(vid, birth, None if death == LIVE else death, t or 0, size, mode, new, stored))
    out.sort(key=lambda v: v.birth_gen, reverse=True)
    return out


def expire(txn: Txn, cutoff_ns: int, keep_inodes: Iterable[int] = ()) -> int:
    """Drop versions and entries that the live tree replaced or removed, that no snapshot
    shows, and that ended at or before `cutoff_ns`; then inodes nothing refers to. Rows of
    `keep_inodes` (inodes the kernel still knows: holds.py) stay."""
    txn.gen  # expiry is a committed change: bump the generation
    txn.execute("CREATE TEMP TABLE IF NOT EXISTS expire_keep(ino INTEGER PRIMARY KEY)")
    txn.execute("DELETE FROM expire_keep")
    txn.conn.executemany("INSERT OR IGNORE INTO expire_keep VALUES (?)", [(ino,) for ino in keep_inodes])
    hidden = (
        "death_gen != {live} AND NOT EXISTS (SELECT 1 FROM snapshots s WHERE s.gen >= {t}.birth_gen AND s.gen < {t}.death_gen)"
        " AND (SELECT time_ns FROM generations g WHERE g.gen = {t}.death_gen) <= ?"
        " AND {t}.ino NOT IN (SELECT ino FROM expire_keep)"
    )
    n = txn.execute(f"DELETE FROM versions WHERE {hidden.format(live=LIVE, t='versions')}", (cutoff_ns,)).rowcount
    n += txn.execute(f"DELETE FROM dentries WHERE {hidden.format(live=LIVE, t='dentries')}", (cutoff_ns,)).rowcount
    txn.execute(
        "DELETE FROM inodes WHERE ino != ? AND NOT EXISTS (SELECT 1 FROM versions v WHERE v.ino = inodes.ino)"
        " AND NOT EXISTS (SELECT 1 FROM dentries d WHERE d.ino = inodes.ino)",
        (ROOT_INO,),
    )
    return n
