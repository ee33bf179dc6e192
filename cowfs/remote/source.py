"""The consumer's view of a bucket: which store to follow, its newest catalog object, and
that catalog made servable from packs (docs/design.md, section 17, "Consumers").

`CACHE/` (the `--cache DIR` of `cowfs mount s3://...`):
  remote.db          what the consumer knows of the bucket (the producer's format: state.py)
  catalog-UUID-G.db  the followed store's catalog as of generation G, its chunk rows pointed
                     at packs (seg_id: the pack's rowid in remote.db, offset: in the pack),
                     made from a whole catalog object or from the one before and a delta
  blocks/PACK/N      cached pack blocks (replica.BlockCache)
"""
from __future__ import annotations

import logging
import os
import sqlite3
import threading
from pathlib import Path

from ..errors import RemoteError, StoreError
from ..store.log import Location, location
from ..store.schema import SCHEMA_VERSION
from .catalogs import CatalogObject, chain_to, retained_catalogs
from .config import REMOTE_STATE_FILE, RemoteConfig
from .deltas import apply_delta, parse_delta_name
from .s3 import Bucket, MissingObject
from .state import RemoteState
from .upload import decode_catalog, indexed_packs, read_index

log = logging.getLogger("cowfs.replica")
CATALOG_SUFFIX = ".db.zst"
PACKS_USED = "replica_packs_used"  # in a cache's catalog file: the packs its chunk rows point at


def _point(conn: sqlite3.Connection, which: str) -> None:
    """Point the chunk rows `which` selects at a pack holding them (remote.db ATTACHed as r):
    seg_id the pack's rowid, with the record's offset, lengths and codec; 0 if none does."""
    conn.execute(
        "UPDATE chunks SET (seg_id, offset, stored_len, raw_len, codec) = (SELECT p.rowid, o.offset,"
        " o.stored_len, o.raw_len, o.codec FROM r.objects o JOIN r.packs p ON p.name = o.pack"
        f" WHERE o.hash = chunks.hash) WHERE ({which}) AND EXISTS (SELECT 1 FROM r.objects o WHERE o.hash = chunks.hash)")
    # chunks no pack holds (garbage the producer had not collected): nowhere to read from
    conn.execute(f"UPDATE chunks SET seg_id = 0 WHERE ({which}) AND NOT EXISTS (SELECT 1 FROM r.objects o"
                 " WHERE o.hash = chunks.hash)")


def catalog_name(store_uuid: str, gen: int) -> str:
    return f"catalog-{store_uuid}-{gen:016d}.db"


class ReplicaSource:
    def __init__(self, cache: Path, cfg: RemoteConfig, store_uuid: str | None) -> None:
        self.cache = cache
        self.bucket = Bucket(cfg)
        self.bucket.check()
        cache.mkdir(parents=True, exist_ok=True)
        self.state = RemoteState(cache / REMOTE_STATE_FILE, cfg.url)
        if self.state.reset:  # the cache served another bucket: its catalogs name packs by old numbers
            self.drop_catalogs(set())
        self._lock = threading.Lock()  # remote.db is used by the sync thread and by readers
        self.store_uuid = store_uuid or self._only_store()

    def _only_store(self) -> str:
        prefix = self.bucket.key("stores", "")
        uuids = sorted({o.key[len(prefix):].split("/", 1)[0] for o in self.bucket.list(prefix)})
        if not uuids:
            raise RemoteError(f"{self.bucket.where}: no store has uploaded a catalog here yet")
        if len(uuids) > 1:
            raise RemoteError(f"{self.bucket.where}: several stores share this prefix; pick one with --store "
                              f"({', '.join(uuids)})")
        return uuids[0]

    # -- what the bucket holds ------------------------------------------------

    def newest(self) -> tuple[int, str]:
        """(generation, key) of the followed store's newest catalog object: a delta from a
        generation the cache holds if there is one, else the whole catalog, else a delta."""
        objects = retained_catalogs(self.bucket, self.store_uuid)
        if not objects:
            raise RemoteError(f"{self.bucket.where}: store {self.store_uuid} has no catalog in the bucket")
        gen = objects[-1].generation
        held = self.held()
        at = [c for c in objects if c.generation == gen]
        best = next((c for c in at if c.from_gen in held), None) or next((c for c in at if c.from_gen is None), at[0])
        return gen, best.key

    def learn_indexes(self) -> int:
        """Read the indexes of packs not known yet, and forget packs whose index is gone (a
        remote gc deleted them; a consumer never writes to the bucket)."""
        with self._lock:
            known = self.state.known_packs()
        listed = indexed_packs(self.bucket)
        with self._lock:
            self.state.forget_packs(known - listed)
        n = 0
        for name in sorted(listed - known):
            idx = read_index(self.bucket, name)
            if idx is None:
                continue
            with self._lock:
                self.state.add_pack(name, idx.size, idx.entries, mine=False)
            n += 1
        return n

    def held(self) -> set[int]:
        """The generations of the catalog files in the cache."""
        prefix = f"catalog-{self.store_uuid}-"
        return {int(f.name[len(prefix):-3]) for f in self.cache.glob(f"{prefix}*.db")
                if f.name[len(prefix):-3].isdigit()}

    def fetch_catalog(self, gen: int, key: str) -> Path:
        """Generation `gen`, made servable from the packs, as CACHE/catalog-UUID-G.db: the
        delta `key` applied to the catalog it starts from if the cache holds it, else the
        chain of objects the bucket has that leads there (a whole catalog and deltas)."""
        dest = self.cache / catalog_name(self.store_uuid, gen)
        if dest.exists():
            return dest
        name = key.rsplit("/", 1)[-1]
        parsed = parse_delta_name(name)
        held = self.held()
        steps: list[CatalogObject] | None = None
        if parsed is None and name.endswith(CATALOG_SUFFIX):
            steps = [CatalogObject(self.store_uuid, gen, key, 0)]
        elif parsed is not None and parsed[1] in held:
            steps = [CatalogObject(self.store_uuid, gen, key, 0, parsed[1])]
        self.learn_indexes()
        for attempt in (1, 2):
            if steps is None:
                steps = chain_to(retained_catalogs(self.bucket, self.store_uuid), gen, held)
                if steps is None:
                    raise RemoteError(f"{self.bucket.where}: no catalog objects of store {self.store_uuid} lead to "
                                      f"generation {gen} (deleted since the notice; a newer one follows)")
            try:
                for step in steps:
                    path = self._whole(step) if step.from_gen is None else self._delta(step)
                return path
            except MissingObject:  # deleted since it was listed (the producer's retention): list again
                if attempt == 2:
                    raise
                steps, held = None, self.held()
            except RemoteError as e:  # a delta that does not apply here: from a whole catalog instead
                if attempt == 2:
                    raise
                log.warning("generation %d from the catalogs held: %s; trying from a whole catalog", gen, e)
                steps, held = None, set()
        raise AssertionError("unreachable")

    def _whole(self, cat: CatalogObject) -> Path:
        dest = self.cache / catalog_name(self.store_uuid, cat.generation)
        tmp = dest.with_name(dest.name + ".tmp")
        tmp.write_bytes(decode_catalog(self.bucket.get(cat.key)))
        conn = sqlite3.connect(tmp, isolation_level=None)
        try:
            (version,) = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
            if int(version) != SCHEMA_VERSION:
                raise StoreError(f"{cat.key}: catalog schema version {version}; this cowfs reads {SCHEMA_VERSION}")
            conn.execute("ATTACH DATABASE ? AS r", (str(self.cache / REMOTE_STATE_FILE),))
            conn.execute("BEGIN")
            conn.execute(f"CREATE TABLE {PACKS_USED} (id INTEGER PRIMARY KEY)")
            _point(conn, "1")
            conn.execute(f"INSERT OR IGNORE INTO {PACKS_USED} SELECT DISTINCT seg_id FROM chunks WHERE seg_id != 0")
            conn.execute("COMMIT")
            conn.execute("DETACH DATABASE r")
            conn.execute("PRAGMA journal_mode=WAL")
        finally:
            conn.close()
        os.replace(tmp, dest)
        return dest

    def _delta(self, cat: CatalogObject) -> Path:
        """The catalog the delta `cat` leads to: a copy of the one it starts from (SQLite's
        backup) with the delta applied, its new chunk rows and those in packs the cache's
        remote.db no longer knows pointed at the packs."""
        assert cat.from_gen is not None
        dest = self.cache / catalog_name(self.store_uuid, cat.generation)
        tmp = dest.with_name(dest.name + ".tmp")
        part = dest.with_name(dest.name + ".delta")
        try:
            part.write_bytes(decode_catalog(self.bucket.get(cat.key)))
            src = sqlite3.connect(f"file:{self.cache / catalog_name(self.store_uuid, cat.from_gen)}?mode=ro", uri=True)
            try:
                tmp.unlink(missing_ok=True)
                dst = sqlite3.connect(tmp)
                try:
                    src.backup(dst)
                finally:
                    dst.close()
            finally:
                src.close()
            conn = sqlite3.connect(tmp, isolation_level=None)
            try:
                conn.execute("PRAGMA journal_mode=DELETE")
                if not conn.execute("SELECT 1 FROM sqlite_master WHERE name=?", (PACKS_USED,)).fetchone():
                    # a catalog file made before deltas: note the packs its rows point at, once
                    conn.execute(f"CREATE TABLE {PACKS_USED} (id INTEGER PRIMARY KEY)")
                    conn.execute(f"INSERT INTO {PACKS_USED} SELECT DISTINCT seg_id FROM chunks WHERE seg_id != 0")
                conn.execute("ATTACH DATABASE ? AS d", (str(part),))
                conn.execute("ATTACH DATABASE ? AS r", (str(self.cache / REMOTE_STATE_FILE),))
                conn.execute("BEGIN")
                apply_delta(conn, cat.from_gen)
                conn.execute(f"CREATE TEMP TABLE repoint AS SELECT cid FROM main.chunks WHERE seg_id IN (SELECT id FROM"
                             f" {PACKS_USED} WHERE id NOT IN (SELECT id FROM r.packs)) UNION SELECT cid FROM d.chunks")
                conn.execute(f"DELETE FROM {PACKS_USED} WHERE id NOT IN (SELECT id FROM r.packs)")
                _point(conn, "cid IN (SELECT cid FROM temp.repoint)")
                conn.execute(f"INSERT OR IGNORE INTO {PACKS_USED} SELECT DISTINCT seg_id FROM chunks"
                             " WHERE cid IN (SELECT cid FROM temp.repoint) AND seg_id != 0")
                conn.execute("COMMIT")
                conn.execute("DETACH DATABASE r")
                conn.execute("DETACH DATABASE d")
                conn.execute("PRAGMA journal_mode=WAL")
            except sqlite3.DatabaseError as e:
                raise RemoteError(f"{cat.key}: the delta does not apply ({e})") from None
            finally:
                conn.close()
            os.replace(tmp, dest)
        finally:
            part.unlink(missing_ok=True)
        return dest

    # -- lookups for the replica's reads ------------------------------------------

    def pack(self, rowid: int) -> tuple[str, int] | None:
        with self._lock:
            row = self.state.conn.execute("SELECT name, size FROM packs WHERE rowid=?", (rowid,)).fetchone()
        return None if row is None else (str(row[0]), int(row[1]))

    def locate(self, chunk_id: bytes) -> Location | None:
        with self._lock:
            row = self.state.conn.execute(
                "SELECT p.rowid, o.offset, o.stored_len, o.codec, o.raw_len FROM objects o JOIN packs p"
                " ON p.name = o.pack WHERE o.hash=?", (chunk_id,)).fetchone()
        return None if row is None else location(*row)

    def drop_catalogs(self, keep: set[Path]) -> None:
        for f in self.cache.glob("catalog-*.db*"):
            base = self.cache / f.name.split(".db")[0]
            if Path(str(base) + ".db") not in keep:
                f.unlink(missing_ok=True)

    def close(self) -> None:
        with self._lock:
            self.state.close()
