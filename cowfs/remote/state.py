"""`STORE/remote.db`: what this store knows of its bucket (docs/format.md, section 9.4).

Every row states a fact about immutable objects (a chunk is at this offset of that pack;
this catalog object holds generation G), so the file is a cache: losing it costs a new
listing of the bucket's indexes, never data. It is written only by the process holding the
store's lock (the daemon, or `cowfs remote push` on an unmounted store).
"""
from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Iterable

from .packs import PackEntry

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (
  key   TEXT PRIMARY KEY,        -- 'url': the remote this file describes
  value NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS packs (
  name     TEXT PRIMARY KEY,     -- BLAKE3-256 of the pack's bytes, hex
  size     INTEGER NOT NULL,     -- bytes
  records  INTEGER NOT NULL,
  added_ns INTEGER NOT NULL,     -- when this store learnt of it
  mine     INTEGER NOT NULL      -- 1: this store uploaded it; 0: found in the bucket's index
);
CREATE TABLE IF NOT EXISTS objects (
  hash       BLOB PRIMARY KEY,   -- chunk id (BLAKE3-256 of the raw bytes)
  pack       TEXT NOT NULL,      -- packs.name
  offset     INTEGER NOT NULL,   -- record header's offset in the pack
  stored_len INTEGER NOT NULL,
  raw_len    INTEGER NOT NULL,
  codec      INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS objects_pack ON objects(pack);
CREATE TABLE IF NOT EXISTS catalogs (
  gen         INTEGER PRIMARY KEY, -- the store generation the catalog object holds
  key         TEXT NOT NULL,       -- its object key
  size        INTEGER NOT NULL,    -- compressed bytes
  uploaded_ns INTEGER NOT NULL
);
"""


class RemoteState:
    """One connection to remote.db; use it from one thread at a time."""

    def __init__(self, path: Path, url: str) -> None:
        self.path = path
        self.conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=NORMAL")
        self.conn.executescript(SCHEMA)
        row = self.conn.execute("SELECT value FROM meta WHERE key='url'").fetchone()
        self.reset = row is not None and row[0] != url  # it described another bucket until now
        if self.reset:
            # facts about another bucket: forget them (the new one is listed afresh)
            with self.txn():
                for table in ("packs", "objects", "catalogs", "meta"):
                    self.conn.execute(f"DELETE FROM {table}")
            row = None
        if row is None:
            self.conn.execute("INSERT OR REPLACE INTO meta VALUES ('url', ?)", (url,))

    def txn(self) -> "sqlite3.Connection":
        return _Txn(self.conn)  # type: ignore[return-value]

    def close(self) -> None:
        self.conn.close()

    # -- packs and the chunks in them ----------------------------------------

    def known_packs(self) -> set[str]:
        return {r[0] for r in self.conn.execute("SELECT name FROM packs")}

    def add_pack(self, name: str, size: int, entries: Iterable[PackEntry], mine: bool) -> None:
        entries = list(entries)
        with self.txn():
            self.conn.execute("INSERT OR IGNORE INTO packs VALUES (?, ?, ?, ?, ?)",
                              (name, size, len(entries), time.time_ns(), int(mine)))
            # a chunk already known in another pack keeps its first location
            self.conn.executemany("INSERT OR IGNORE INTO objects VALUES (?, ?, ?, ?, ?, ?)",
                                  [(e.chunk_id, name, e.offset, e.stored_len, e.raw_len, e.codec) for e in entries])

    def has(self, hashes: list[bytes]) -> set[bytes]:
        found: set[bytes] = set()
        for i in range(0, len(hashes), 500):
            part = hashes[i:i + 500]
            q = "SELECT hash FROM objects WHERE hash IN (%s)" % ",".join("?" * len(part))
            found.update(bytes(r[0]) for r in self.conn.execute(q, part))
        return found

    def where(self, chunk_id: bytes) -> PackEntry | None:
        row = self.conn.execute("SELECT offset, stored_len, raw_len, codec FROM objects WHERE hash=?",
                                (chunk_id,)).fetchone()
        return None if row is None else PackEntry(chunk_id, *row)

    def pack_of(self, chunk_id: bytes) -> str | None:
        row = self.conn.execute("SELECT pack FROM objects WHERE hash=?", (chunk_id,)).fetchone()
        return None if row is None else str(row[0])

    def missing_chunks(self, catalog_copy: Path) -> list[tuple[bytes, int]]:
        """(hash, stored_len) of the chunks the copied catalog's bodies use (with the delta
        bases they decode from) that no known pack holds, in log order."""
        self.conn.execute("ATTACH DATABASE ? AS snap", (str(catalog_copy),))
        try:
            rows = self.conn.execute(
                "WITH RECURSIVE keep(cid) AS (SELECT cid FROM snap.extents WHERE cid IS NOT NULL"
                " UNION SELECT c.base_cid FROM snap.chunks c JOIN keep k ON c.cid = k.cid"
                " WHERE c.base_cid IS NOT NULL)"
                " SELECT c.hash, c.stored_len FROM snap.chunks c WHERE c.cid IN (SELECT cid FROM keep)"
                " AND NOT EXISTS (SELECT 1 FROM objects o WHERE o.hash = c.hash)"
                " ORDER BY c.seg_id, c.offset").fetchall()
        finally:
            self.conn.execute("DETACH DATABASE snap")
        return [(bytes(h), n) for h, n in rows]

    # -- catalogs --------------------------------------------------------------

    def last_catalog(self) -> int:
        row = self.conn.execute("SELECT max(gen) FROM catalogs").fetchone()
        return int(row[0] or 0)

    def add_catalog(self, gen: int, key: str, size: int) -> None:
        self.conn.execute("INSERT OR REPLACE INTO catalogs VALUES (?, ?, ?, ?)", (gen, key, size, time.time_ns()))

    def catalogs(self) -> list[tuple[int, str]]:
        return [(int(g), str(k)) for g, k in self.conn.execute("SELECT gen, key FROM catalogs ORDER BY gen")]

    def forget_catalogs(self, gens: list[int]) -> None:
        self.conn.executemany("DELETE FROM catalogs WHERE gen=?", [(g,) for g in gens])

    def totals(self) -> dict[str, int]:
        packs, size, mine_size = self.conn.execute(
            "SELECT count(*), coalesce(sum(size), 0), coalesce(sum(size * mine), 0) FROM packs").fetchone()
        (objects,) = self.conn.execute("SELECT count(*) FROM objects").fetchone()
        return {"packs": int(packs), "pack_bytes": int(size), "uploaded_bytes": int(mine_size),
                "chunks": int(objects), "catalog_generation": self.last_catalog()}


class _Txn:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def __enter__(self) -> sqlite3.Connection:
        self.conn.execute("BEGIN IMMEDIATE")
        return self.conn

    def __exit__(self, exc_type: object, *rest: object) -> None:
        self.conn.execute("COMMIT" if exc_type is None else "ROLLBACK")
