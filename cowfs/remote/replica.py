"""A read-only replica of a store whose catalog and chunks are in a bucket: the consumer's
side of the remote tier (docs/design.md, section 17).

`Replica` is a `Store` whose catalog is a copy of the producer's (one generation, its chunk
rows pointed at the packs that hold them) and whose log reads records from packs: ranged
GETs of `BLOCK`-sized, aligned pieces (up to GET_BLOCKS of them in one GET when read
ahead), kept in a cache on disk (`CACHE/blocks/`), read ahead for sequential readers.
Every read is checked as a read from a local segment is (record header, chunk id, payload
CRC; BLAKE3 of decoded deltas), so a damaged or missing object gives EIO, never wrong bytes.
"""
from __future__ import annotations

import errno
import logging
import mmap
import os
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from .. import _native
from ..errors import CorruptData, ReadOnly, RemoteError
from ..store.catalog import events as ev
from ..store.catalog.db import Catalog
from ..store.catalog.events import Event
from ..store.catalog.snapshots import Snapshot
from ..store.data.index import ChunkIndex
from ..store.log.layout import StoreConfig
from ..store.log.log import Log
from ..store.store import Store
from .s3 import Bucket, MissingObject

if TYPE_CHECKING:
    from .pins import Pins
    from .source import ReplicaSource

log = logging.getLogger("cowfs.replica")
BLOCK = 4 << 20  # bytes per ranged GET and per cached block
FETCH_THREADS = 8
RECENT_BLOCKS = 16  # blocks kept in memory as well (64 MiB)
AHEAD_BLOCKS = 8  # blocks fetched beyond the range a reader says it will read
MAX_PENDING_WRITES = 8  # fetched blocks waiting for the cache's disk; beyond, they are not cached
GET_BLOCKS = 4  # blocks read ahead by one GET (docs/benchmarks.md, "Remote tier": botocore's cost per request)


class BlockCache:
    """Pack blocks fetched from the bucket, as files `blocks/PACK/N` (N: block number),
    evicted oldest first beyond `limit` bytes. A block file is the block's bytes and their
    CRC-32 (u32 LE), written to a temporary name and renamed, so a crash leaves whole blocks
    or none, and a block damaged on the local disk is fetched again."""

    def __init__(self, root: Path, bucket: Bucket, limit: int) -> None:
        self.root = root
        self.bucket = bucket
        self.limit = limit
        self._lock = threading.Lock()
        self._sizes: OrderedDict[tuple[str, int], int] = OrderedDict()
        self._fetching: dict[tuple[str, int], Future[bytes]] = {}
        self._recent: OrderedDict[tuple[str, int], bytes] = OrderedDict()  # checked blocks in memory
        self.pool = ThreadPoolExecutor(FETCH_THREADS, thread_name_prefix="cowfs-fetch")
        self.writer = ThreadPoolExecutor(1, thread_name_prefix="cowfs-cache-write")
        self._writes_pending = 0
        self._stage_buf: mmap.mmap | None = None
        root.mkdir(parents=True, exist_ok=True)
        found = []
        for pack_dir in root.iterdir():
            for f in pack_dir.iterdir():
                if f.name.isdigit():
                    st = f.stat()
                    found.append((st.st_mtime_ns, (pack_dir.name, int(f.name)), st.st_size))
                else:
                    f.unlink(missing_ok=True)  # a block cut short by a crash
        for _, key, size in sorted(found):
            self._sizes[key] = size
        self.fetched_bytes = 0

    def _path(self, key: tuple[str, int]) -> Path:
        return self.root / key[0] / str(key[1])

    def block(self, pack: str, n: int, pack_size: int) -> bytes:
        """Block n of a pack (short at the pack's end), from the cache or the bucket. A cached
        block ends with the CRC-32 of its bytes; one that does not match is fetched again."""
        key = (pack, n)
        with self._lock:
            data = self._recent.get(key)
            if data is not None:
                self._recent.move_to_end(key)
                return data
        try:
            raw = self._path(key).read_bytes()
            data, crc = raw[:-4], raw[-4:]
            if len(raw) >= 4 and _native.crc32(data).to_bytes(4, "little") == crc:
                with self._lock:
                    if key in self._sizes:
                        self._sizes.move_to_end(key)
                    self._remember(key, data)
                return data
            self.forget(pack, n)  # damaged on the local disk: the bucket has it
        except OSError:  # gone or unreadable (deleted behind the cache's back, a failing disk)
            with self._lock:  # no longer counted, so prefetch fetches it again
                self._sizes.pop(key, None)
        return self._fetch(key, pack_size).result()

    def prefetch(self, pack: str, first: int, last: int, pack_size: int) -> None:
        """Start fetching blocks first..last of a pack that are neither in memory, on the disk
        nor on their way: each run of such blocks by GETs of up to GET_BLOCKS blocks."""
        last = min(last, (pack_size - 1) // BLOCK)
        runs: list[list[tuple[int, Future[bytes]]]] = []
        with self._lock:
            run: list[tuple[int, Future[bytes]]] = []
            for n in range(first, last + 1):
                key = (pack, n)
                if key in self._recent or key in self._fetching or key in self._sizes:
                    if run:
                        runs.append(run)
                        run = []
                    continue
                fut = self._fetching[key] = Future()
                run.append((n, fut))
                if len(run) == GET_BLOCKS:
                    runs.append(run)
                    run = []
            if run:
                runs.append(run)
        for run in runs:
            self.pool.submit(self._download, pack, run, pack_size)

    def _fetch(self, key: tuple[str, int], pack_size: int) -> Future[bytes]:
        with self._lock:
            fut = self._fetching.get(key)
            if fut is None:
                fut = self._fetching[key] = Future()
                self.pool.submit(self._download, key[0], [(key[1], fut)], pack_size)
        return fut

    def _download(self, pack: str, run: list[tuple[int, Future[bytes]]], pack_size: int) -> None:
        """GET consecutive blocks of a pack in one request and hand each to the readers waiting
        on its future as soon as it has arrived; each is written to the disk cache afterwards,
        by the writer thread (readers never wait on that write)."""
        start = run[0][0] * BLOCK
        length = min(len(run) * BLOCK, pack_size - start)
        done = 0
        try:
            for data in self.bucket.range_pieces(self.bucket.key("packs", pack), start, length, BLOCK):
                n, fut = run[done]
                done += 1
                self._arrived((pack, n), fut, data)
            for n, fut in run[done:]:  # blocks past the pack's end: empty
                done += 1
                self._arrived((pack, n), fut, b"")
        except BaseException as e:  # noqa: BLE001 - the readers waiting get it
            with self._lock:
                for n, _ in run[done:]:
                    self._fetching.pop((pack, n), None)
            for _, fut in run[done:]:
                fut.set_exception(e)

    def _arrived(self, key: tuple[str, int], fut: Future[bytes], data: bytes) -> None:
        with self._lock:
            self.fetched_bytes += len(data)
            self._remember(key, data)
            self._fetching.pop(key, None)
            cache_it = self._writes_pending < MAX_PENDING_WRITES
            if cache_it:
                self._writes_pending += 1
        fut.set_result(data)
        if cache_it:
            self.writer.submit(self._store, key, data)
        else:
            log.debug("block %s/%d not cached: %d writes pending", key[0][:16], key[1], MAX_PENDING_WRITES)

    def _store(self, key: tuple[str, int], data: bytes) -> None:
        """Write a fetched block to the cache: its bytes and their CRC, to a temporary name,
        renamed. O_DIRECT from a page-aligned buffer, so the write costs the CPU no copy into
        the page cache (that copy took a third of a consumer's CPU on cold reads)."""
        path = self._path(key)
        tmp = path.with_name(f"{key[1]}.tmp{threading.get_ident()}")
        size = len(data) + 4
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_DIRECT, 0o600)
                direct = True
            except OSError as e:
                if e.errno != errno.EINVAL:  # a filesystem without O_DIRECT writes through the page cache
                    raise
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
                direct = False
            try:
                if direct:
                    stage = self._stage(size)
                    stage[:len(data)] = data
                    stage[len(data):size] = _native.crc32(data).to_bytes(4, "little")
                    padded = -(-size // 4096) * 4096
                    _write_all(fd, memoryview(stage)[:padded])
                    os.ftruncate(fd, size)
                else:
                    _write_all(fd, memoryview(data + _native.crc32(data).to_bytes(4, "little")))
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except OSError as e:  # a full or failing cache disk: the block stays uncached
            tmp.unlink(missing_ok=True)
            log.warning("block %s/%d not cached: %s", key[0][:16], key[1], e)
            return
        finally:
            with self._lock:
                self._writes_pending -= 1
        with self._lock:
            self._sizes[key] = len(data)
            self._evict()

    def _stage(self, size: int) -> mmap.mmap:
        """The writer thread's page-aligned buffer (one thread writes: one buffer)."""
        need = -(-size // 4096) * 4096
        if self._stage_buf is None or len(self._stage_buf) < need:
            self._stage_buf = mmap.mmap(-1, max(need, BLOCK + 4096))
        return self._stage_buf

    def _remember(self, key: tuple[str, int], data: bytes) -> None:
        """Keep a block read or fetched last in memory (call with the lock held): the reader's
        windows are not aligned with blocks, so most blocks are asked for twice or more."""
        self._recent[key] = data
        self._recent.move_to_end(key)
        while len(self._recent) > RECENT_BLOCKS:
            self._recent.popitem(last=False)

    def _evict(self) -> None:
        total = sum(self._sizes.values())
        while total > self.limit and len(self._sizes) > 1:
            key, size = self._sizes.popitem(last=False)
            self._path(key).unlink(missing_ok=True)
            total -= size

    def forget(self, pack: str, n: int) -> None:
        with self._lock:
            self._sizes.pop((pack, n), None)
            self._recent.pop((pack, n), None)
        self._path((pack, n)).unlink(missing_ok=True)

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.writer.shutdown(wait=True)
        with self._lock:  # GETs cancelled before they started: their readers must not wait forever
            waiting, self._fetching = list(self._fetching.values()), {}
        for fut in waiting:
            if not fut.done():
                fut.set_exception(CorruptData("the block cache was closed before the block was fetched"))


def _write_all(fd: int, view: memoryview) -> None:
    while len(view):
        view = view[os.write(fd, view):]


class PackSegment:
    """One pack, read like a segment file (`read_into`, `will_need`)."""

    def __init__(self, name: str, size: int, cache: BlockCache) -> None:
        self.name, self.size, self.cache = name, size, cache

    def read_into(self, offset: int, buffers: list[memoryview]) -> int:
        want = min(sum(len(b) for b in buffers), max(self.size - offset, 0))
        got = 0
        pos = offset
        views = [b for b in buffers if len(b)]
        try:
            while got < want:
                n, within = divmod(pos, BLOCK)
                block = self.cache.block(self.name, n, self.size)
                take = memoryview(block)[within:within + want - got]
                if not len(take):
                    break  # a block shorter than the pack's index says: the caller sees a short read
                while len(take):
                    v = views[0]
                    k = min(len(v), len(take))
                    v[:k] = take[:k]
                    take = take[k:]
                    views[0] = v[k:]
                    if not len(views[0]):
                        views.pop(0)
                    got += k
                    pos += k
        except MissingObject:
            raise CorruptData(f"pack {self.name[:16]} is missing from the bucket") from None
        except RemoteError as e:
            raise CorruptData(f"pack {self.name[:16]}: {e}") from None
        return got

    def will_need(self, offset: int, length: int) -> None:
        first, last = offset // BLOCK, (offset + max(length, 1) - 1) // BLOCK
        self.cache.prefetch(self.name, first, min(last, first + 8) + AHEAD_BLOCKS, self.size)

    def close(self) -> None:
        pass


class PackLog(Log):
    """The log of a replica: segment ids are pack numbers (`packs.rowid` of the cache's remote.db)."""

    def __init__(self, root: Path, config: StoreConfig, cache: BlockCache,
                 packs: Callable[[int], tuple[str, int] | None]) -> None:
        super().__init__(root, config, self._no_new_segments)
        self.cache = cache
        self._packs = packs

    @staticmethod
    def _no_new_segments() -> int:
        raise ReadOnly("a replica of a remote store is read-only")

    def segment(self, seg_id: int) -> PackSegment:  # type: ignore[override]
        seg = self._open.get(seg_id)
        if seg is None:
            found = self._packs(seg_id)
            if found is None:
                raise CorruptData(f"no pack {seg_id} in the bucket's indexes (a chunk no pack holds)")
            seg = PackSegment(found[0], found[1], self.cache)
            with self._lock:
                self._open[seg_id] = seg  # type: ignore[assignment]
        return seg


class Replica(Store):
    """A Store over a replica's cache directory (see the module text); writes raise ReadOnly."""

    def __init__(self, root: Path, config: StoreConfig, catalog: Path, source: "ReplicaSource", cache_limit: int,
                 workers: int | None = None) -> None:
        self.blocks = BlockCache(root / "blocks", source.bucket, cache_limit)
        log = PackLog(root, config, self.blocks, source.pack)
        log.locate = source.locate
        # no lock file (the cache directory's lock is the daemon's), one chunking thread (no writes)
        self._serve(root, config, -1, Catalog(catalog), log, workers, chunk_workers=1)
        self._old_catalogs: list[Catalog] = []
        # a consumer of every store pins its snapshots in the bucket (pins.py); one of one store
        # shows its producer's snapshots and takes none
        self.pins: Pins | None = getattr(source, "pins", None)

    def use_catalog(self, new: Catalog) -> list[Catalog]:
        """Serve `new` from now on. The old catalog stays open (requests in flight may still
        use it); returns those to close now (all but the newest four old ones)."""
        old, self.catalog = self.catalog, new
        self.index = ChunkIndex(new)
        self._old_catalogs.append(old)
        done, self._old_catalogs = self._old_catalogs[:-4], self._old_catalogs[-4:]
        return done

    def catalog_paths(self) -> set[Path]:
        return {self.catalog.path, *(c.path for c in self._old_catalogs)}

    def open_session(self, ino: int):  # type: ignore[no-untyped-def, override]
        raise ReadOnly("a replica of a remote store is read-only")

    def _change(self, op, fn, describe=None, durable=True):  # type: ignore[no-untyped-def, override]
        raise ReadOnly(f"{op}: a replica of a remote store is read-only")

    def snapshot_create(self, name: str, gen: int | None = None) -> Snapshot:
        if self.pins is None:
            raise ReadOnly("snapshot: a consumer of one store is read-only: it shows its producer's snapshots and "
                           "takes none (a consumer of every store, --all-stores, pins its own in the bucket)")
        snap = self.pins.pin(name, gen)
        self.events.publish([Event(ev.SNAPSHOT, snap.gen, snap.created_ns, snapshot=snap.name)])
        return snap

    def snapshot_delete(self, name: str) -> None:
        if self.pins is None:
            raise ReadOnly("snapshot-delete: a consumer of one store is read-only: it shows its producer's snapshots "
                           "(delete them there)")
        gen = self.pins.unpin(name)
        self.events.publish([Event(ev.SNAPSHOT_DELETE, gen, time.time_ns(), snapshot=name)])

    def gc(self, progress=None):  # type: ignore[no-untyped-def, override]
        raise ReadOnly("gc: a replica of a remote store is read-only (the producer collects)")

    def compact(self, progress=None, stop=None, **kw):  # type: ignore[no-untyped-def, override]
        raise ReadOnly("compact: a replica of a remote store is read-only")

    def expire_history(self, keep_within_ns: int = 0) -> int:
        raise ReadOnly("prune: a replica of a remote store is read-only")

    def fsck(self, repair: bool = False, progress=None):  # type: ignore[no-untyped-def, override]
        raise ReadOnly("fsck: check the producer's store (a replica keeps no segments)")

    def close(self) -> None:
        if self.closed:
            return
        self.executor.shutdown(wait=True)
        self.readahead.shutdown(wait=True, cancel_futures=True)
        self.blocks.close()
        self.catalog.close()
        for old in self._old_catalogs:
            old.close()
        self.closed = True
