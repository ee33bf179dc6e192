"""Snapshots of the union pinned in the bucket (`cowfs mount s3://... --all-stores`, with
`--snapshot-on checkpoint` or `cowfs snapshot create`): docs/design.md section 17, "Pinned
snapshots", and docs/format.md section 9.10.

A consumer's merged catalog is a cache built again at every mount, and the stores' own
history is theirs to prune. So a snapshot of the union lives in the bucket: `pins/NAME.db.zst`
is a catalog (the engine's schema) holding exactly the tree the snapshot shows, with the chunk
rows its files use. Remote gc counts those chunks as live like a store's catalog objects',
so the packs holding them stay while the pin does, whatever the producers prune. Every
`--all-stores` mount of the prefix shows every pin under `.snapshots/NAME`.

Taking one (`Pins.pin`): the merged tree as of generation G copied into a new catalog file
(merge.py, with the merged catalog as its one source, read at G); refused if a chunk it uses
is in no pack the consumer knows, or in a pack a doomed list names (remote gc may delete it);
PUT (unless a pin of that name is there already: another consumer took it); the doomed lists
looked at again (a list that appeared during the PUT and names one of its packs: the pin is
deleted and refused); then the merged catalog's snapshot row, pinned at G.
"""
from __future__ import annotations

import logging
import os
import sqlite3
import threading
from pathlib import Path

import zstandard

from ..errors import CowfsError, Exists, NotFound, RemoteError
from ..store.catalog import snapshots as snaps
from ..store.catalog.db import one_transaction
from ..store.catalog.snapshots import Snapshot, validate_snapshot_name
from .catalogs import PIN_SUFFIX, PINS, fetch_catalog
from .consumer_bucket import ConsumerBucket
from .doomed import list_doomed
from .merge import MergedCatalog, Step, fresh
from .s3 import Bucket, ListedObject
from .source import PACKS_USED, point_chunks

log = logging.getLogger("cowfs.replica")
PIN_LEVEL = 3  # zstd level, as catalog objects
MERGED_SOURCE = "namespace"  # the merged catalog as a pin's one source
LOADING = "pin:"  # the merged catalog's name for a pin brought in at mount
_EXTRA_TABLES = ("replica_ns_files", "replica_ns_contents", "replica_ns_stores", PACKS_USED)


class PinRefused(RemoteError):
    """The snapshot cannot be pinned whole now (a chunk in no pack, or in a doomed one)."""


def pin_key(bucket: Bucket, name: str) -> str:
    return bucket.key(PINS, name + PIN_SUFFIX)


def listed_pins(bucket: Bucket) -> list[tuple[str, ListedObject]]:
    """(snapshot name, object) of every pin under the prefix, by name; keys that are not a
    valid pin name are left out."""
    prefix = bucket.key(PINS, "")
    out = []
    for obj in bucket.list(prefix):
        stem = obj.key[len(prefix):]
        if not stem.endswith(PIN_SUFFIX):
            continue
        name = stem[:-len(PIN_SUFFIX)]
        try:
            validate_snapshot_name(name)
        except CowfsError:
            continue
        out.append((name, obj))
    return sorted(out, key=lambda p: p[0])


def _doomed_packs(bucket: Bucket) -> tuple[set[str], set[str]]:
    """(the doomed lists' keys, the packs they name)."""
    keys: set[str] = set()
    packs: set[str] = set()
    for d in list_doomed(bucket):
        if d.doomed is not None:
            keys.add(d.key)
            packs.update(p.name for p in d.doomed.packs)
    return keys, packs


class Pins:
    """The pins of one `--all-stores` consumer: `merged` is its merged catalog, written only
    under `write_lock` (held by the union's steps too)."""

    def __init__(self, cache: Path, shared: ConsumerBucket, merged: MergedCatalog, write_lock: threading.Lock) -> None:
        self.cache = cache
        self.shared = shared
        self.bucket = shared.bucket
        self.merged = merged
        self.write_lock = write_lock

    # -- at mount ------------------------------------------------------------------------

    def load(self) -> int:
        """Every pin under the prefix made a snapshot of the (still empty) merged catalog: its
        tree merged in, the snapshot row at that generation, its tree taken out again.
        Returns how many; a pin that cannot be read is left out with a warning."""
        n = 0
        for i, (name, obj) in enumerate(listed_pins(self.bucket)):
            dest = self.cache / f"pin-{os.getpid()}-{i}.db"
            try:
                if not fetch_catalog(self.bucket, obj.key, dest):
                    continue  # deleted since the listing
                self._point(dest)
                gen = _generation(dest)
                store = LOADING + name
                with self.write_lock:
                    self.merged.steps([Step(store, dest, 0, gen, None)])
                    at = self.merged.generation
                    one_transaction(self.merged.conn, lambda t: snaps.create(t, name, at), "snapshot")
                    self.merged.forget(store)
                n += 1
            except (CowfsError, sqlite3.DatabaseError) as e:
                log.warning("pinned snapshot %s not shown: %s", name, e)
            finally:
                for f in (dest, dest.with_name(dest.name + "-wal"), dest.with_name(dest.name + "-shm")):
                    f.unlink(missing_ok=True)
        return n

    def _point(self, path: Path) -> None:
        """A fetched pin's chunk rows pointed at this consumer's packs (its seg_ids were the
        pinning consumer's pack numbers)."""
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            conn.execute("ATTACH DATABASE ? AS r", (str(self.shared.state_path),))
            with self.shared.lock:
                conn.execute("BEGIN")
                point_chunks(conn, "1")
                conn.execute("COMMIT")
        finally:
            conn.close()

    # -- taking and dropping ---------------------------------------------------------------

    def pin(self, name: str, gen: int | None) -> Snapshot:
        """Pin the merged tree as of `gen` (None: now) as snapshot `name` (see the module text)."""
        validate_snapshot_name(name)
        with self.write_lock:
            if self.merged.conn.execute("SELECT 1 FROM snapshots WHERE name=?", (name,)).fetchone():
                raise Exists(f"snapshot {name!r} already exists")
            at = self.merged.generation if gen is None else gen
        build = self.cache / f"pin-build-{os.getpid()}-{threading.get_ident()}.db"
        try:
            packs = self._build(build, at)
            lists, doomed = _doomed_packs(self.bucket)
            if packs & doomed:
                raise PinRefused(f"snapshot {name!r} not pinned: remote gc has doomed {len(packs & doomed)} of the "
                                 f"packs it reads (its files were pruned by their stores)")
            key = pin_key(self.bucket, name)
            put = not self.bucket.exists(key)
            if put:
                with open(build, "rb") as f:
                    data = zstandard.ZstdCompressor(level=PIN_LEVEL, write_content_size=True).compress(f.read())
                self.bucket.put(key, data)
                lists_after, doomed_after = _doomed_packs(self.bucket)
                if lists_after - lists and packs & doomed_after:
                    self.bucket.delete([key])
                    raise PinRefused(f"snapshot {name!r} not pinned: a remote gc doomed packs it reads while it was "
                                     "uploaded; try again")
            else:
                log.info("snapshot %s: a pin of that name is in the bucket already (another consumer's); kept", name)
            try:
                with self.write_lock:
                    snap = one_transaction(self.merged.conn, lambda t: snaps.create(t, name, at), "snapshot")
            except BaseException:
                if put:
                    self.bucket.delete([key])
                raise
        finally:
            for f in (build, build.with_name(build.name + "-wal"), build.with_name(build.name + "-shm")):
                f.unlink(missing_ok=True)
        log.info("pinned snapshot %s (generation %d) as %s", name, at, pin_key(self.bucket, name))
        return snap

    def _build(self, path: Path, gen: int) -> set[str]:
        """The pin's catalog file at `path`: the merged tree as of `gen`. Returns the packs
        its chunk rows read; PinRefused if a chunk is in none."""
        built = fresh(path, self.shared.state_path)
        try:
            built.steps([Step(MERGED_SOURCE, self.merged.path, 0, gen, None)])
        finally:
            built.close()
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            conn.execute("ATTACH DATABASE ? AS r", (str(self.shared.state_path),))
            with self.shared.lock:
                missing = conn.execute("SELECT count(*) FROM chunks c WHERE NOT EXISTS"
                                       " (SELECT 1 FROM r.packs p WHERE p.rowid = c.seg_id)").fetchone()[0]
                packs = {str(r[0]) for r in conn.execute(
                    "SELECT DISTINCT p.name FROM chunks c JOIN r.packs p ON p.rowid = c.seg_id")}
            if missing:
                raise PinRefused(f"{missing} chunks of the snapshot are in no pack of the bucket")
            conn.execute("DETACH DATABASE r")
            for table in _EXTRA_TABLES:
                conn.execute(f"DROP TABLE IF EXISTS {table}")
            conn.execute("PRAGMA journal_mode = DELETE")
            conn.execute("VACUUM")
        finally:
            conn.close()
        return packs

    def unpin(self, name: str) -> int:
        """Drop snapshot `name`: its pin leaves the bucket first, then the merged catalog's row
        (killed between: the row goes with the cache at the next mount). Returns the
        generation of the row's deletion."""
        with self.write_lock:
            if not self.merged.conn.execute("SELECT 1 FROM snapshots WHERE name=?", (name,)).fetchone():
                raise NotFound(f"no snapshot named {name!r}")
        self.bucket.delete([pin_key(self.bucket, name)])
        with self.write_lock:
            gen = one_transaction(self.merged.conn, lambda t: (snaps.delete(t, name), t.gen)[1], "snapshot-delete")
        log.info("unpinned snapshot %s", name)
        return gen


def _generation(path: Path) -> int:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return int(conn.execute("SELECT value FROM meta WHERE key='generation'").fetchone()[0])
    finally:
        conn.close()
