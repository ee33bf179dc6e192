"""The catalog objects in a bucket prefix, `stores/UUID/catalog/G.db.zst` (whole) and
`stores/UUID/catalog/G.from-F.delta.zst` (deltas), and consumers' pinned snapshots
`pins/NAME.db.zst`, read back: which are retained, one
fetched into a local SQLite file, the chain of objects that leads to a generation and the
catalog it makes, and the set of chunk hashes all of them hold (what remote gc keeps),
gathered on disk in a scratch database rather than in memory.
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
from .deltas import apply_delta
from .s3 import Bucket, MissingObject

_CATALOG = re.compile(r"^([0-9a-f-]{36})/catalog/(\d{16})(?:\.from-(\d{16})\.delta\.zst|\.db\.zst)$")


@dataclass(frozen=True)
class CatalogObject:
    store_uuid: str
    generation: int
    key: str
    size: int
    from_gen: int | None = None  # a delta: the generation it starts from; None: a whole catalog


def retained_catalogs(bucket: Bucket, store_uuid: str | None = None) -> list[CatalogObject]:
    """Every catalog object under `stores/` (of one store, if given), whole ones and deltas,
    by store then generation (a delta after the whole catalog of its generation)."""
    prefix = bucket.key("stores", store_uuid, "") if store_uuid else bucket.key("stores", "")
    top = bucket.key("stores", "")
    out = []
    for obj in bucket.list(prefix):
        m = _CATALOG.match(obj.key[len(top):])
        if m:
            out.append(CatalogObject(m.group(1), int(m.group(2)), obj.key, obj.size,
                                     int(m.group(3)) if m.group(3) else None))
    return sorted(out, key=lambda c: (c.store_uuid, c.generation, c.from_gen is not None, c.from_gen or 0))


PINS = "pins"
PIN_SUFFIX = ".db.zst"
PIN_STORE = "pinned"  # CatalogObject.store_uuid of a pin


def pinned_catalogs(bucket: Bucket) -> list[CatalogObject]:
    """Every pinned snapshot under `pins/` (remote/pins.py), as a catalog object of
    generation 0, by key."""
    prefix = bucket.key(PINS, "")
    return sorted((CatalogObject(PIN_STORE, 0, obj.key, obj.size) for obj in bucket.list(prefix)
                   if obj.key.endswith(PIN_SUFFIX)), key=lambda c: c.key)


def pin_name(key: str) -> str:
    """The snapshot name of a pin's key (`.../pins/NAME.db.zst`)."""
    return key.rsplit("/", 1)[-1][:-len(PIN_SUFFIX)]


def fetch_catalog(bucket: Bucket, key: str, dest: Path) -> bool:
    """The catalog object `key`, decompressed into `dest` (streamed: the decompressed copy is
    never held in memory). False if it was deleted since it was listed (its store uploaded a
    newer one); RemoteError if it is not a readable catalog."""
    try:
        data = bucket.get(key)
    except MissingObject:
        return False
    write_catalog(bucket.where, key, data, dest)
    return True


def write_catalog(where: str, key: str, data: bytes, dest: Path) -> None:
    """A catalog object's bytes (`key`'s, as uploaded) decompressed into `dest`; RemoteError
    if they are not a readable catalog."""
    try:
        with open(dest, "wb") as f:
            zstandard.ZstdDecompressor().copy_stream(io.BytesIO(data), f)
        conn = sqlite3.connect(dest)
        try:
            conn.execute("SELECT hash, base_cid FROM chunks LIMIT 1").fetchall()
        finally:
            conn.close()
    except (zstandard.ZstdError, sqlite3.DatabaseError) as e:
        raise RemoteError(f"{where}: {key} is not a readable catalog ({e})") from None


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
        """Every catalog object retained in the prefix now, of every store, and every pinned
        snapshot (`pins/NAME.db.zst`, a catalog of the tree a consumer's snapshot shows)."""
        for cat in retained_catalogs(bucket):
            self.add(bucket, cat)
        for cat in pinned_catalogs(bucket):
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


def chain_to(objects: list[CatalogObject], gen: int, have: set[int]) -> list[CatalogObject] | None:
    """The catalog objects that lead to generation `gen`, in the order to apply them: deltas
    from one of the generations in `have` (catalogs the reader holds), or a whole catalog
    and the deltas after it; the fewest objects, a held start preferred when it needs as
    many. None if none leads there (the objects it would need were deleted)."""
    wholes = {c.generation: c for c in objects if c.from_gen is None}
    into: dict[int, list[CatalogObject]] = {}
    for c in objects:
        if c.from_gen is not None:
            into.setdefault(c.generation, []).append(c)
    frontier: list[tuple[int, list[CatalogObject]]] = [(gen, [])]
    seen = {gen}
    best: list[CatalogObject] | None = None  # from a whole catalog: one object more than its depth
    while frontier:
        for g, path in frontier:
            if g in have:
                return path
        if best is not None:  # a held start one level deeper costs as many objects, and less
            return best
        for g, path in frontier:
            if g in wholes:
                best = [wholes[g], *path]
                break
        nxt = []
        for g, path in frontier:
            for d in into.get(g, []):
                assert d.from_gen is not None
                if d.from_gen not in seen:
                    seen.add(d.from_gen)
                    nxt.append((d.from_gen, [d, *path]))
        frontier = nxt
    return best


def chain_ends(objects: list[CatalogObject]) -> list[list[CatalogObject]]:
    """For each whole catalog, the objects leading from it to the newest generation its
    deltas reach: what a check of the retained catalogs materializes."""
    deltas = [c for c in objects if c.from_gen is not None]
    out = []
    for w in (c for c in objects if c.from_gen is None):
        reach = {w.generation}
        grew = True
        while grew:
            more = {d.generation for d in deltas if d.from_gen in reach} - reach
            reach |= more
            grew = bool(more)
        chain = chain_to([w, *deltas], max(reach), set())
        out.append(chain if chain is not None and chain[0] is w else [w])
    return out


def materialize(bucket: Bucket, chain: list[CatalogObject], dest: Path) -> bool:
    """The catalog a chain (a whole catalog, then deltas) leads to, at `dest`; False if one
    of its objects was deleted since it was listed."""
    if not fetch_catalog(bucket, chain[0].key, dest):
        return False
    gen = chain[0].generation
    part = dest.with_name(dest.name + ".delta")
    try:
        for d in chain[1:]:
            if not fetch_catalog(bucket, d.key, part):
                return False
            conn = sqlite3.connect(dest, isolation_level=None)
            try:
                conn.execute("ATTACH DATABASE ? AS d", (str(part),))
                conn.execute("BEGIN")
                gen = apply_delta(conn, gen)
                conn.execute("COMMIT")
            finally:
                conn.close()
    finally:
        part.unlink(missing_ok=True)
    return True
