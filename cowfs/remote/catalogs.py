"""The catalog objects in a bucket prefix, `stores/UUID/catalog/G.db.zst`, read back: which
are retained, one fetched into a local SQLite file, and the set of chunk hashes all of them
hold (what remote gc keeps), gathered on disk in a scratch database rather than in memory.
"""
from __future__ import annotations

import io
import re
import sqlite3
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import zstandard

from ..errors import RemoteError
from .s3 import Bucket, MissingObject

_CATALOG = re.compile(r"^([0-9a-f-]{36})/catalog/(\d{16})\.db\.zst$")


@dataclass(frozen=True)
class CatalogObject:
    store_uuid: str
    generation: int
    key: str
    size: int


def retained_catalogs(bucket: Bucket, store_uuid: str | None = None) -> list[CatalogObject]:
    """Every catalog object under `stores/` (of one store, if given), by store then generation."""
    prefix = bucket.key("stores", store_uuid, "") if store_uuid else bucket.key("stores", "")
    top = bucket.key("stores", "")
    out = []
    for obj in bucket.list(prefix):
        m = _CATALOG.match(obj.key[len(top):])
        if m:
            out.append(CatalogObject(m.group(1), int(m.group(2)), obj.key, obj.size))
    return sorted(out, key=lambda c: (c.store_uuid, c.generation))


def fetch_catalog(bucket: Bucket, key: str, dest: Path) -> bool:
    """The catalog object `key`, decompressed into `dest` (streamed: the decompressed copy is
    never held in memory). False if it was deleted since it was listed (its store uploaded a
    newer one); RemoteError if it is not a readable catalog."""
    try:
        data = bucket.get(key)
    except MissingObject:
        return False
    try:
        with open(dest, "wb") as f:
            zstandard.ZstdDecompressor().copy_stream(io.BytesIO(data), f)
        conn = sqlite3.connect(dest)
        try:
            conn.execute("SELECT hash, base_cid FROM chunks LIMIT 1").fetchall()
        finally:
            conn.close()
    except (zstandard.ZstdError, sqlite3.DatabaseError) as e:
        raise RemoteError(f"{bucket.where}: {key} is not a readable catalog ({e})") from None
    return True


class LiveSet:
    """The hashes of every `chunks` row of the catalog objects added, in a scratch database
    under `tmpdir` (deleted on close). A pack holding one of them is live."""

    def __init__(self, tmpdir: Path) -> None:
        tmpdir.mkdir(exist_ok=True)
        self.dir = Path(tempfile.mkdtemp(prefix="remote-gc-", dir=tmpdir))
        self.path = self.dir / "live.db"
        self.conn = sqlite3.connect(self.path, isolation_level=None)
        self.conn.execute("PRAGMA journal_mode=OFF")
        self.conn.execute("PRAGMA synchronous=OFF")
        self.conn.execute("CREATE TABLE live (hash BLOB PRIMARY KEY) WITHOUT ROWID")
        self.catalogs: list[CatalogObject] = []

    def add_bucket(self, bucket: Bucket) -> None:
        """Every catalog object retained in the prefix now, of every store."""
        for cat in retained_catalogs(bucket):
            self.add(bucket, cat)

    def add(self, bucket: Bucket, cat: CatalogObject) -> None:
        copy = self.dir / "catalog.db"
        try:
            if not fetch_catalog(bucket, cat.key, copy):
                return  # gone since the listing: a newer catalog of its store replaced it
            self.conn.execute("ATTACH DATABASE ? AS cat", (str(copy),))
            try:
                self.conn.execute("INSERT OR IGNORE INTO live SELECT hash FROM cat.chunks")
            finally:
                self.conn.execute("DETACH DATABASE cat")
            self.catalogs.append(cat)
        finally:
            copy.unlink(missing_ok=True)

    def __len__(self) -> int:
        return int(self.conn.execute("SELECT count(*) FROM live").fetchone()[0])

    def close(self) -> None:
        self.conn.close()
        self.path.unlink(missing_ok=True)
        self.dir.rmdir()

    def __enter__(self) -> "LiveSet":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
