"""The consumer's view of a bucket: which store to follow, its newest catalog object, and
that catalog made servable from packs (docs/design.md, section 17, "Consumers").

`CACHE/` (the `--cache DIR` of `cowfs mount s3://...`):
  remote.db          what the consumer knows of the bucket (the producer's format: state.py)
  catalog-UUID-B.db  the followed store's catalog, made from the whole catalog object of
                     generation B and brought forward by each delta in place (one SQLite
                     transaction each: the file holds one generation or the next, never a
                     mix); its generation is its `meta.generation`. Its chunk rows are
                     pointed at packs (seg_id: the pack's rowid in remote.db, offset: in the
                     pack)
  blocks/PACK/N      cached pack blocks (replica.BlockCache)
"""
from __future__ import annotations

import logging
import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..errors import RemoteError, StoreError
from ..store.catalog.schema import SAME_TABLES, SCHEMA_VERSION
from ..store.log.log import Location
from .catalogs import CatalogObject, chain_to, fetch_catalog, retained_catalogs, write_catalog
from .changes import Changes, scan
from .config import REMOTE_STATE_FILE, RemoteConfig
from .consumer_bucket import ConsumerBucket
from .deltas import apply_delta, parse_delta_name
from .notices import Inline
from .s3 import MissingObject

log = logging.getLogger("cowfs.replica")
CATALOG_SUFFIX = ".db.zst"
PACKS_USED = "replica_packs_used"  # in a cache's catalog file: the packs its chunk rows point at


def point_chunks(conn: sqlite3.Connection, which: str) -> None:
    """Point the chunk rows `which` selects at a pack holding them (remote.db ATTACHed as r):
    seg_id the pack's rowid, with the record's offset, lengths and codec; 0 if none does."""
    conn.execute(
        "UPDATE chunks SET (seg_id, offset, stored_len, raw_len, codec) = (SELECT p.rowid, o.offset,"
        " o.stored_len, o.raw_len, o.codec FROM r.objects o JOIN r.packs p ON p.name = o.pack"
        f" WHERE o.hash = chunks.hash) WHERE ({which}) AND EXISTS (SELECT 1 FROM r.objects o WHERE o.hash = chunks.hash)")
    # chunks no pack holds (garbage the producer had not collected): nowhere to read from
    conn.execute(f"UPDATE chunks SET seg_id = 0 WHERE ({which}) AND NOT EXISTS (SELECT 1 FROM r.objects o"
                 " WHERE o.hash = chunks.hash)")


def catalog_name(store_uuid: str, gen: int, unique: bool = False) -> str:
    """A catalog file's name: by the generation of the whole catalog it was made from (and a
    random part when a file of that name still serves)."""
    return f"catalog-{store_uuid}-{gen:016d}{'-' + os.urandom(4).hex() if unique else ''}.db"


@dataclass
class Fetched:
    """A generation made servable: the file holding it, and what changed since the file
    served before (`new_file`: a file other than the one that served)."""
    path: Path
    generation: int
    changes: Changes
    new_file: bool


def check_schema(conn: sqlite3.Connection, name: str) -> None:
    """Refuse a whole catalog whose tables are not this cowfs's (schema versions SAME_TABLES:
    a producer not yet upgraded to 7 writes 6 or 5, the same tables without codec 5 or 4)."""
    (version,) = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
    if int(version) not in SAME_TABLES:
        raise StoreError(f"{name}: catalog schema version {version};"
                         f" this cowfs reads {SAME_TABLES[0]}-{SCHEMA_VERSION}")


class ReplicaSource:
    """One followed store's catalog files in the cache. `shared`: the consumer's bucket and
    remote.db when it follows several stores (union_source.py); else its own."""

    def __init__(self, cache: Path, cfg: RemoteConfig, store_uuid: str | None,
                 shared: ConsumerBucket | None = None) -> None:
        self.cache = cache
        self.shared = shared or ConsumerBucket(cache, cfg)
        self._owns_shared = shared is None
        self.bucket = self.shared.bucket
        if self._owns_shared and self.shared.reset:
            self.drop_catalogs(set(), every_store=True)
        self.store_uuid = store_uuid or self._only_store()

    def _only_store(self) -> str:
        uuids = self.shared.store_uuids()
        if not uuids:
            raise RemoteError(f"{self.bucket.where}: no store has uploaded a catalog here yet (--all-stores "
                              "follows the prefix's stores as they appear)")
        if len(uuids) > 1:
            raise RemoteError(f"{self.bucket.where}: several stores share this prefix; pick one with --store, or "
                              f"show them all with --all-stores ({', '.join(uuids)})")
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
        return self.shared.learn_indexes()

    def _files(self) -> dict[Path, int]:
        """The catalog files of the followed store in the cache, with the generation each holds."""
        out: dict[Path, int] = {}
        for f in self.cache.glob(f"catalog-{self.store_uuid}-*.db"):
            try:
                conn = sqlite3.connect(f"file:{f}?mode=ro", uri=True)
                try:
                    out[f] = int(conn.execute("SELECT value FROM meta WHERE key='generation'").fetchone()[0])
                finally:
                    conn.close()
            except (sqlite3.DatabaseError, TypeError):  # not a catalog (cut short before its rename: never)
                log.warning("%s: not a catalog; removed", f)
                f.unlink(missing_ok=True)
        return out

    def held(self) -> set[int]:
        """The generations of the catalog files in the cache."""
        return set(self._files().values())

    def current(self) -> tuple[Path, int] | None:
        """The catalog file holding the newest generation, and that generation."""
        files = self._files()
        if not files:
            return None
        path = max(files, key=lambda f: (files[f], f.name))
        return path, files[path]

    def fetch_catalog(self, gen: int, key: str, learn: bool = True,
                      before_apply: Callable[[], None] | None = None, inline: Inline | None = None) -> "Fetched":
        """Generation `gen`, made servable from the packs: the delta `key` applied in place to
        the catalog file holding the generation it starts from, else the chain of objects the
        bucket has that leads there (a whole catalog, as a new file, and deltas applied to it).
        `learn` False: the caller learns the indexes; `before_apply` (then) is called after
        each object is downloaded and before it is applied, which needs the indexes of the
        packs its chunks are in: it returns once they are learnt (or raises why not), so the
        downloads run beside the learning (union_source.py).

        `inline`: what the notice of `gen` carried (notices.Inline): the object `key` is taken
        from it, not from the bucket, and its indexes are learnt first; with no learning asked
        for or waited on, an object that names a chunk in no known pack is applied only after a
        look at the bucket (consumer_bucket.py)."""
        cur = self.current()
        if cur is not None and cur[1] >= gen:
            return Fetched(cur[0], cur[1], Changes(cur[1], cur[1]), new_file=False)
        check = inline is not None and before_apply is None
        if inline is not None and check:
            self.shared.add_indexes(inline.indexes)
        elif learn:
            self.learn_indexes()

        def ready(path: Path) -> None:
            if before_apply is not None:
                before_apply()
            if check:
                if self.shared.unresolved(path):
                    self.learn_indexes()
                else:
                    self.shared.applied_without_look()

        return self._fetch(cur, gen, key, ready, (key, inline.catalog) if inline is not None else None)

    def _fetch(self, cur: tuple[Path, int] | None, gen: int, key: str, ready: Callable[[Path], None],
               carried: tuple[str, bytes] | None) -> "Fetched":
        name = key.rsplit("/", 1)[-1]
        parsed = parse_delta_name(name)
        held = {cur[1]} if cur is not None else set()
        steps: list[CatalogObject] | None = None
        if parsed is None and name.endswith(CATALOG_SUFFIX):
            steps = [CatalogObject(self.store_uuid, gen, key, 0)]
        elif parsed is not None and parsed[1] in held:
            steps = [CatalogObject(self.store_uuid, gen, key, 0, parsed[1])]
        origin = cur[1] if cur is not None else 0
        changes = Changes(origin, gen)  # since the generation served before, over every step
        new_file = False  # a whole catalog made a new file (in either attempt)
        for attempt in (1, 2):
            if steps is None:
                steps = chain_to(retained_catalogs(self.bucket, self.store_uuid), gen, held)
                if steps is None:
                    raise RemoteError(f"{self.bucket.where}: no catalog objects of store {self.store_uuid} lead to "
                                      f"generation {gen} (deleted since the notice; a newer one follows)")
            path = cur[0] if cur is not None else None
            try:
                for step in steps:
                    if step.from_gen is None:
                        path, new_file = self._whole(step, ready, carried), True
                    else:
                        assert path is not None
                        self._delta(path, step, changes, ready, carried)
                assert path is not None
                if new_file:  # what changed since the generation served before: a scan of the new file
                    changes = self._scan(path, origin, gen)
                return Fetched(path, gen, changes, new_file)
            except MissingObject:  # deleted since it was listed (the producer's retention): list again
                if attempt == 2:
                    raise
                cur = self.current()  # deltas applied before the missing one stay applied
                held = {cur[1]} if cur is not None else set()
            except RemoteError as e:  # a delta that does not apply here: from a whole catalog instead
                if attempt == 2:
                    raise
                log.warning("generation %d from the catalogs held: %s; trying from a whole catalog", gen, e)
                held = set()
            steps = None
        raise AssertionError("unreachable")

    def _get(self, key: str, dest: Path, carried: tuple[str, bytes] | None = None) -> None:
        """A catalog object decompressed into `dest`, streamed (catalogs.fetch_catalog), or
        from the bytes a notice `carried` (its key, its bytes) if it is that one."""
        if carried is not None and carried[0] == key:
            write_catalog("a notice", key, carried[1], dest)
        elif not fetch_catalog(self.bucket, key, dest):
            raise MissingObject(f"{self.bucket.where}: {key} was deleted since it was listed")

    @staticmethod
    def _scan(path: Path, old: int, new: int) -> Changes:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            return scan(conn, old, new)
        finally:
            conn.close()

    def _whole(self, cat: CatalogObject, ready: Callable[[Path], None], carried: tuple[str, bytes] | None) -> Path:
        dest = self.cache / catalog_name(self.store_uuid, cat.generation)
        tmp = dest.with_name(dest.name + ".tmp")
        self._get(cat.key, tmp, carried)
        ready(tmp)
        conn = sqlite3.connect(tmp, isolation_level=None)
        try:
            check_schema(conn, cat.key)
            conn.execute("ATTACH DATABASE ? AS r", (str(self.cache / REMOTE_STATE_FILE),))
            conn.execute("BEGIN")
            conn.execute(f"CREATE TABLE {PACKS_USED} (id INTEGER PRIMARY KEY)")
            point_chunks(conn, "1")
            conn.execute(f"INSERT OR IGNORE INTO {PACKS_USED} SELECT DISTINCT seg_id FROM chunks WHERE seg_id != 0")
            conn.execute("COMMIT")
            conn.execute("DETACH DATABASE r")
            conn.execute("PRAGMA journal_mode=WAL")
        finally:
            conn.close()
        if dest.exists():  # a file of this name serves (a catch-up from the same whole catalog): a new name
            dest = self.cache / catalog_name(self.store_uuid, cat.generation, unique=True)
        os.replace(tmp, dest)
        return dest

    def _delta(self, path: Path, cat: CatalogObject, changes: Changes, ready: Callable[[Path], None],
               carried: tuple[str, bytes] | None) -> None:
        """Apply the delta `cat` to the catalog file `path` in place, in one transaction: its
        rows, then its new chunk rows and those in packs the cache's remote.db no longer
        knows pointed at the packs; what it changed is added to `changes`. Readers of the
        file (the replica's requests) see the generation before or the one after."""
        assert cat.from_gen is not None
        part = path.with_name(f"{path.name}.{cat.generation}.delta")
        try:
            self._get(cat.key, part, carried)
            ready(part)
            conn = sqlite3.connect(path, isolation_level=None)
            try:
                conn.execute("ATTACH DATABASE ? AS d", (str(part),))
                conn.execute("ATTACH DATABASE ? AS r", (str(self.cache / REMOTE_STATE_FILE),))
                conn.execute("BEGIN IMMEDIATE")
                (held,) = conn.execute("SELECT value FROM main.meta WHERE key='generation'").fetchone()
                if int(held) != cat.from_gen:
                    raise RemoteError(f"{cat.key}: the catalog file holds generation {held}, not {cat.from_gen}")
                if not conn.execute("SELECT 1 FROM main.sqlite_master WHERE name=?", (PACKS_USED,)).fetchone():
                    # a catalog file made before deltas: note the packs its rows point at, once
                    conn.execute(f"CREATE TABLE main.{PACKS_USED} (id INTEGER PRIMARY KEY)")
                    conn.execute(f"INSERT INTO main.{PACKS_USED} SELECT DISTINCT seg_id FROM main.chunks"
                                 " WHERE seg_id != 0")
                apply_delta(conn, cat.from_gen)
                changes.add_rows(conn, "d", cat.from_gen, cat.generation)
                conn.execute(f"CREATE TEMP TABLE repoint AS SELECT cid FROM main.chunks WHERE seg_id IN (SELECT id FROM"
                             f" {PACKS_USED} WHERE id NOT IN (SELECT id FROM r.packs)) UNION SELECT cid FROM d.chunks")
                conn.execute(f"DELETE FROM {PACKS_USED} WHERE id NOT IN (SELECT id FROM r.packs)")
                point_chunks(conn, "cid IN (SELECT cid FROM temp.repoint)")
                conn.execute(f"INSERT OR IGNORE INTO {PACKS_USED} SELECT DISTINCT seg_id FROM chunks"
                             " WHERE cid IN (SELECT cid FROM temp.repoint) AND seg_id != 0")
                conn.execute("COMMIT")
            except sqlite3.DatabaseError as e:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise RemoteError(f"{cat.key}: the delta does not apply ({e})") from None
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            finally:
                conn.close()
        finally:
            part.unlink(missing_ok=True)

    # -- lookups for the replica's reads ------------------------------------------

    def pack(self, rowid: int) -> tuple[str, int] | None:
        return self.shared.pack(rowid)

    def locate(self, chunk_id: bytes) -> Location | None:
        return self.shared.locate(chunk_id)

    def drop_catalogs(self, keep: set[Path], every_store: bool = False) -> None:
        """Remove the followed store's catalog files (`every_store`: every store's) in the
        cache but those in `keep` (with their -wal, -shm and .reserve), and what fetches cut
        short left (a whole catalog's .tmp, a delta's part). Called between fetches, never
        during one."""
        for f in self.cache.glob("catalog-*.db*" if every_store else f"catalog-{self.store_uuid}-*.db*"):
            base, _, rest = f.name.partition(".db")
            if rest.endswith((".tmp", ".delta")) or self.cache / f"{base}.db" not in keep:
                f.unlink(missing_ok=True)

    def close(self) -> None:
        if self._owns_shared:
            self.shared.close()
