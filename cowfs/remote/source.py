"""The consumer's view of a bucket: which store to follow, its newest catalog object, and
that catalog made servable from packs (docs/design.md, section 17, "Consumers").

`CACHE/` (the `--cache DIR` of `cowfs mount s3://...`):
  remote.db          what the consumer knows of the bucket (the producer's format: state.py)
  catalog-UUID-G.db  the followed store's catalog as of generation G, its chunk rows pointed
                     at packs (seg_id: the pack's rowid in remote.db, offset: in the pack)
  blocks/PACK/N      cached pack blocks (replica.BlockCache)
"""
from __future__ import annotations

import os
import sqlite3
import threading
from pathlib import Path

from ..errors import RemoteError, StoreError
from ..store.log import Location, location
from ..store.schema import SCHEMA_VERSION
from .config import REMOTE_STATE_FILE, RemoteConfig
from .s3 import Bucket
from .state import RemoteState
from .upload import decode_catalog, indexed_packs, read_index

CATALOG_SUFFIX = ".db.zst"


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
        """(generation, key) of the followed store's newest catalog object."""
        prefix = self.bucket.key("stores", self.store_uuid, "catalog", "")
        best: tuple[int, str] | None = None
        for obj in self.bucket.list(prefix):
            name = obj.key[len(prefix):]
            if name.endswith(CATALOG_SUFFIX) and name[:-len(CATALOG_SUFFIX)].isdigit():
                gen = int(name[:-len(CATALOG_SUFFIX)])
                if best is None or gen > best[0]:
                    best = (gen, obj.key)
        if best is None:
            raise RemoteError(f"{self.bucket.where}: store {self.store_uuid} has no catalog in the bucket")
        return best

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

    def fetch_catalog(self, gen: int, key: str) -> Path:
        """The catalog object `key`, made servable from the packs, as CACHE/catalog-UUID-G.db."""
        dest = self.cache / catalog_name(self.store_uuid, gen)
        if dest.exists():
            return dest
        tmp = dest.with_name(dest.name + ".tmp")
        tmp.write_bytes(decode_catalog(self.bucket.get(key)))
        self.learn_indexes()
        conn = sqlite3.connect(tmp, isolation_level=None)
        try:
            (version,) = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
            if int(version) != SCHEMA_VERSION:
                raise StoreError(f"{key}: catalog schema version {version}; this cowfs reads {SCHEMA_VERSION}")
            conn.execute("ATTACH DATABASE ? AS r", (str(self.cache / REMOTE_STATE_FILE),))
            conn.execute("BEGIN")
            conn.execute(
                "UPDATE chunks SET (seg_id, offset, stored_len, raw_len, codec) = (SELECT p.rowid, o.offset,"
                " o.stored_len, o.raw_len, o.codec FROM r.objects o JOIN r.packs p ON p.name = o.pack"
                " WHERE o.hash = chunks.hash)"
                " WHERE EXISTS (SELECT 1 FROM r.objects o WHERE o.hash = chunks.hash)")
            # chunks no pack holds (garbage the producer had not collected): nowhere to read from
            conn.execute("UPDATE chunks SET seg_id = 0 WHERE NOT EXISTS (SELECT 1 FROM r.objects o"
                         " WHERE o.hash = chunks.hash)")
            conn.execute("COMMIT")
            conn.execute("DETACH DATABASE r")
            conn.execute("PRAGMA journal_mode=WAL")
        finally:
            conn.close()
        os.replace(tmp, dest)
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
