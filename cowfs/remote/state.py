"""`STORE/remote.db`: what this store knows of its bucket (docs/format.md, section 9.5).

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

from .deltas import Mark
from .packs import PackEntry

STATE_SCHEMA = 2  # meta 'schema'; a file of another version is emptied at open (a cache)
SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (
  key   TEXT PRIMARY KEY,        -- 'url': the remote this file describes; 'schema': STATE_SCHEMA
  value NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS packs (
  id       INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused (a consumer's catalogs name packs by it)
  name     TEXT NOT NULL UNIQUE, -- BLAKE3-256 of the pack's bytes, hex
  size     INTEGER NOT NULL,     -- bytes
  records  INTEGER NOT NULL,
  added_ns INTEGER NOT NULL,     -- when this store learnt of it
  mine     INTEGER NOT NULL      -- 1: this store uploaded it; 0: found in the bucket's index
);
CREATE TABLE IF NOT EXISTS objects (
  hash       BLOB NOT NULL,      -- chunk id (BLAKE3-256 of the raw bytes)
  pack       TEXT NOT NULL,      -- packs.name
  offset     INTEGER NOT NULL,   -- record header's offset in the pack
  stored_len INTEGER NOT NULL,
  raw_len    INTEGER NOT NULL,
  codec      INTEGER NOT NULL,
  PRIMARY KEY (hash, pack)       -- every pack holding the chunk (the first record of it in each)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS objects_pack ON objects(pack);
CREATE TABLE IF NOT EXISTS catalogs (
  key         TEXT PRIMARY KEY,    -- the catalog object's key
  gen         INTEGER NOT NULL,    -- the store generation it holds (a delta: leads to)
  from_gen    INTEGER,             -- a delta: the generation it starts from; NULL: a whole catalog
  size        INTEGER NOT NULL,    -- compressed bytes
  uploaded_ns INTEGER NOT NULL,
  epoch       TEXT,                -- the change log's mark when its rows were read (deltas.Mark)
  seq         INTEGER
);
CREATE TABLE IF NOT EXISTS doomed (
  pack TEXT NOT NULL,            -- a pack named by a doomed list in gc/ at the last look (remote gc)
  list TEXT NOT NULL,            -- that list's name
  PRIMARY KEY (pack, list)
) WITHOUT ROWID;
"""
TABLES = ("meta", "packs", "objects", "catalogs", "doomed")
NOT_DOOMED = "pack NOT IN (SELECT pack FROM doomed)"


class RemoteState:
    """One connection to remote.db; use it from one thread at a time."""

    def __init__(self, path: Path, url: str) -> None:
        self.path = path
        self.conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=NORMAL")
        # a file of an older layout (before remote gc): its facts are dropped and learnt again
        self.reset = self._drop_other_schema()
        self.conn.executescript(SCHEMA)
        row = self.conn.execute("SELECT value FROM meta WHERE key='url'").fetchone()
        if row is not None and row[0] != url:  # it described another bucket until now
            # facts about another bucket: forget them (the new one is listed afresh)
            with self.txn():
                for table in TABLES:
                    self.conn.execute(f"DELETE FROM {table}")
            self.reset, row = True, None
        if row is None:
            self.conn.execute("INSERT OR REPLACE INTO meta VALUES ('url', ?)", (url,))
        self.conn.execute("INSERT OR REPLACE INTO meta VALUES ('schema', ?)", (STATE_SCHEMA,))

    def _drop_other_schema(self) -> bool:
        tables = {r[0] for r in self.conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if "catalogs" in tables and "from_gen" not in {r[1] for r in self.conn.execute("PRAGMA table_info(catalogs)")}:
            self.conn.execute("DROP TABLE catalogs")  # whole catalogs only, before deltas: the next pass uploads one
        if "meta" not in tables:
            return False
        row = self.conn.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
        if row is not None and int(row[0]) == STATE_SCHEMA:
            return False
        with self.txn():
            for table in TABLES:
                self.conn.execute(f"DROP TABLE IF EXISTS {table}")
        return True

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
            self.conn.execute("INSERT OR IGNORE INTO packs (name, size, records, added_ns, mine) VALUES (?, ?, ?, ?, ?)",
                              (name, size, len(entries), time.time_ns(), int(mine)))
            # a pack holding a record twice: its first one
            self.conn.executemany("INSERT OR IGNORE INTO objects VALUES (?, ?, ?, ?, ?, ?)",
                                  [(e.chunk_id, name, e.offset, e.stored_len, e.raw_len, e.codec) for e in entries])

    def forget_packs(self, names: Iterable[str]) -> int:
        """Drop packs that are no longer in the bucket (a remote gc deleted them); returns how
        many were known. If any was, the next pass checks a whole catalog (`base_due`)."""
        gone = 0
        with self.txn():
            for name in names:
                self.conn.execute("DELETE FROM objects WHERE pack=?", (name,))
                gone += self.conn.execute("DELETE FROM packs WHERE name=?", (name,)).rowcount
            if gone:
                self.conn.execute("INSERT OR REPLACE INTO meta VALUES ('full_check', ?)", (time.time_ns(),))
        return gone

    def has(self, hashes: list[bytes]) -> set[bytes]:
        """Those of `hashes` in a known pack that no doomed list names."""
        found: set[bytes] = set()
        for i in range(0, len(hashes), 500):
            part = hashes[i:i + 500]
            q = f"SELECT hash FROM objects WHERE hash IN (%s) AND {NOT_DOOMED}" % ",".join("?" * len(part))
            found.update(bytes(r[0]) for r in self.conn.execute(q, part))
        return found

    def locations(self, chunk_id: bytes) -> list[tuple[str, PackEntry]]:
        """(pack, entry) of every known pack holding the chunk, those no doomed list names first."""
        return [(pack, entry) for pack, _size, entry in self.holders([chunk_id]).get(chunk_id, [])]

    def holders(self, hashes: list[bytes]) -> dict[bytes, list[tuple[str, int, PackEntry]]]:
        """(pack, pack size, entry) of every known pack holding each of `hashes`, those no
        doomed list names first (a pack and its objects rows come and go together)."""
        out: dict[bytes, list[tuple[str, int, PackEntry]]] = {}
        for i in range(0, len(hashes), 500):
            part = hashes[i:i + 500]
            q = ("SELECT o.hash, o.pack, p.size, o.offset, o.stored_len, o.raw_len, o.codec FROM objects o"
                 " JOIN packs p ON p.name = o.pack WHERE o.hash IN (%s)"
                 " ORDER BY o.pack IN (SELECT pack FROM doomed), o.pack" % ",".join("?" * len(part)))
            for h, pack, size, *entry in self.conn.execute(q, part):
                out.setdefault(bytes(h), []).append((str(pack), int(size), PackEntry(bytes(h), *entry)))
        return out

    def location(self, chunk_id: bytes) -> tuple[str, PackEntry] | None:
        """(pack, entry) of a pack holding the chunk: one no doomed list names if there is one."""
        found = self.locations(chunk_id)
        return found[0] if found else None

    def where(self, chunk_id: bytes) -> PackEntry | None:
        loc = self.location(chunk_id)
        return None if loc is None else loc[1]

    def pack_of(self, chunk_id: bytes) -> str | None:
        loc = self.location(chunk_id)
        return None if loc is None else loc[0]

    # -- doomed packs (remote gc, docs/design.md section 17) ----------------------

    def set_doomed(self, lists: dict[str, list[str]]) -> None:
        """The doomed lists in gc/ now: list name -> the packs it names (replaces the last look's)."""
        with self.txn():
            self.conn.execute("DELETE FROM doomed")
            self.conn.executemany("INSERT OR IGNORE INTO doomed VALUES (?, ?)",
                                  [(p, name) for name, packs in lists.items() for p in packs])

    def doomed_lists(self) -> set[str]:
        return {r[0] for r in self.conn.execute("SELECT DISTINCT list FROM doomed")}

    def doomed_packs(self) -> set[str]:
        return {r[0] for r in self.conn.execute("SELECT DISTINCT pack FROM doomed")}

    def packs_of_list(self, name: str) -> list[str]:
        return [r[0] for r in self.conn.execute("SELECT pack FROM doomed WHERE list=?", (name,))]

    def missing_chunks(self, catalog_copy: Path) -> list[tuple[bytes, int]]:
        """(hash, stored_len) of the chunks the copied catalog's bodies use (with the delta
        bases they decode from) that no known pack holds but doomed ones, in log order."""
        self.conn.execute("ATTACH DATABASE ? AS snap", (str(catalog_copy),))
        try:
            rows = self.conn.execute(
                "WITH RECURSIVE keep(cid) AS (SELECT cid FROM snap.extents WHERE cid IS NOT NULL"
                " UNION SELECT c.base_cid FROM snap.chunks c JOIN keep k ON c.cid = k.cid"
                " WHERE c.base_cid IS NOT NULL)"
                " SELECT c.hash, c.stored_len FROM snap.chunks c WHERE c.cid IN (SELECT cid FROM keep)"
                f" AND NOT EXISTS (SELECT 1 FROM objects o WHERE o.hash = c.hash AND o.{NOT_DOOMED})"
                " ORDER BY c.seg_id, c.offset").fetchall()
        finally:
            self.conn.execute("DETACH DATABASE snap")
        return [(bytes(h), n) for h, n in rows]

    # -- catalogs --------------------------------------------------------------

    def last_catalog(self) -> int:
        row = self.conn.execute("SELECT max(gen) FROM catalogs").fetchone()
        return int(row[0] or 0)

    def add_catalog(self, key: str, gen: int, from_gen: int | None, size: int, mark: Mark | None) -> None:
        self.conn.execute("INSERT OR REPLACE INTO catalogs VALUES (?, ?, ?, ?, ?, ?, ?)",
                          (key, gen, from_gen, size, time.time_ns(), mark and mark.epoch, mark and mark.seq))

    def catalogs(self) -> list[tuple[int, str]]:
        """(generation, key) of every catalog object noted, oldest first (a delta after the
        whole catalog of its generation)."""
        return [(int(g), str(k)) for g, k in self.conn.execute(
            "SELECT gen, key FROM catalogs ORDER BY gen, from_gen IS NOT NULL, key")]

    def since(self) -> tuple[int, Mark] | None:
        """(generation, mark) of the newest catalog object whose mark is known: what the next
        delta starts from."""
        row = self.conn.execute("SELECT gen, epoch, seq FROM catalogs WHERE epoch IS NOT NULL"
                                " ORDER BY gen DESC LIMIT 1").fetchone()
        return None if row is None else (int(row[0]), Mark(str(row[1]), int(row[2])))

    def newest_whole(self) -> int | None:
        """The generation of the newest whole catalog noted."""
        row = self.conn.execute("SELECT max(gen) FROM catalogs WHERE from_gen IS NULL").fetchone()
        return None if row[0] is None else int(row[0])

    def chain(self) -> tuple[int, int, int] | None:
        """(bytes of the newest whole catalog, bytes and number of the deltas after it)."""
        row = self.conn.execute("SELECT gen, size FROM catalogs WHERE from_gen IS NULL ORDER BY gen DESC LIMIT 1"
                                ).fetchone()
        if row is None:
            return None
        n, size = self.conn.execute("SELECT count(*), coalesce(sum(size), 0) FROM catalogs WHERE from_gen IS NOT NULL"
                                    " AND gen > ?", (row[0],)).fetchone()
        return int(row[1]), int(size), int(n)

    def full_check_due(self) -> int | None:
        """When a pack was last forgotten, if no whole catalog went up since (ns), else None."""
        row = self.conn.execute("SELECT value FROM meta WHERE key='full_check'").fetchone()
        return None if row is None else int(row[0])

    def full_check_done(self, since: int | None) -> None:
        """A whole catalog read after `full_check_due` gave `since` went up: clear the flag
        unless a pack was forgotten after that."""
        if since is not None:
            self.conn.execute("DELETE FROM meta WHERE key='full_check' AND value=?", (since,))

    def forget_catalogs(self, keys: list[str]) -> None:
        self.conn.executemany("DELETE FROM catalogs WHERE key=?", [(k,) for k in keys])

    def totals(self) -> dict[str, int]:
        packs, size, mine_size = self.conn.execute(
            "SELECT count(*), coalesce(sum(size), 0), coalesce(sum(size * mine), 0) FROM packs").fetchone()
        (objects,) = self.conn.execute("SELECT count(DISTINCT hash) FROM objects").fetchone()
        return {"packs": int(packs), "pack_bytes": int(size), "uploaded_bytes": int(mine_size),
                "chunks": int(objects), "doomed_packs": len(self.doomed_packs()),
                "catalog_generation": self.last_catalog()}


class _Txn:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def __enter__(self) -> sqlite3.Connection:
        self.conn.execute("BEGIN IMMEDIATE")
        return self.conn

    def __exit__(self, exc_type: object, *rest: object) -> None:
        self.conn.execute("COMMIT" if exc_type is None else "ROLLBACK")
