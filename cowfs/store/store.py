"""The Store: the one door to the engine for the FUSE layer and the CLI.

Opening a store takes its lock, runs recovery (recovery.py) and starts the
catalog writer thread and the chunking workers. The Store holds the locks and
the order of steps; what each step does to the catalog lives beside it
(namespace, commit, history, snapshots, stats, gc, fsck). Its tree changes
(tree.py) and its snapshots and history (versions.py) are mixed in. Every public
method is safe to call from any thread.
"""
from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Callable, TypeVar

from ..errors import Busy, InvalidArgument, IsADirectory, NotFound
from .catalog import namespace as ns
from .catalog import xattrs
from .catalog.db import Catalog, Txn, create_catalog
from .catalog.events import Event, EventBus
from .catalog.namespace import Attr
from .data.batch_threads import BatchThreads, named_pool
from .data.commit import commit_version, version_events
from .data.content import Extent, VersionId, any_compacted, chunk_locations, load_extents
from .data.holds import Holds
from .data.index import ChunkIndex
from .data.reader import MOST_AHEAD, WINDOW_BUFFER, FileReader
from .data.session import SessionHandle, WriteSession
from .log.buffers import window_pool
from .log.codecs import load_libraries as load_codec_libraries
from .log.evicted import EvictedSegments, PackReader
from .log.heads import MOST_HEADS
from .log.layout import (
    CATALOG_FILE,
    DEFAULT_DEVICE,
    DEFAULT_SEGMENT_SIZE,
    MAX_CHAIN,
    StoreConfig,
    check_new_store_dir,
    fsync_dir,
    new_config,
    read_config,
    take_lock,
    write_config,
)
from .log.log import Location, Log, check_chunk
from .recovery import SPILL_DIR, check_ownership, recover
from .tree import TreeChanges
from .versions import VersionChanges
from .upkeep.fsck import FsckReport, check
from .upkeep.gc import GcReport, collect
from .upkeep.stats import catalog_stats, physical_bytes, report

if TYPE_CHECKING:
    from .tensors.compact_body import CompactReport

T = TypeVar("T")


class Store(TreeChanges, VersionChanges):
    def __init__(self, root: Path, config: StoreConfig, lock_fd: int, workers: int | None = None,
                 pack_reader: Callable[[Path], PackReader] | None = None) -> None:
        catalog = Catalog(root / CATALOG_FILE)
        try:
            check_ownership(root, catalog, config.store_uuid)
            recovered = recover(root, catalog, config.device)
        except BaseException:
            catalog.close()
            raise
        # a head segment per worker (up to 8): appends running at once write different files
        log = Log(root, config, self._new_segment_id, heads=min(MOST_HEADS, workers or os.cpu_count() or 2))
        log.locate_many = lambda ids: self.catalog.read(lambda conn: chunk_locations(conn, ids))  # delta bases
        log.evicted = EvictedSegments(root, pack_reader)  # reads of segments kept only in the bucket
        self._serve(root, config, lock_fd, catalog, log, workers)
        self.recovered_bytes = recovered
        self.capabilities_stored = self.catalog.read(xattrs.any_capability)  # see may_have_xattr

    def _serve(self, root: Path, config: StoreConfig, lock_fd: int, catalog: Catalog, log: Log,
               workers: int | None, chunk_workers: int | None = None) -> None:
        """The parts of every Store around its catalog and its log (which the caller made: a
        replica of a remote store makes its own, remote/replica.py)."""
        self.root = root
        self.config = config
        self._lock_fd = lock_fd
        self.catalog = catalog
        self.recovered_bytes = 0
        self.log = log
        self.index = ChunkIndex(catalog)
        self.capabilities_stored = True
        # threads for per-byte work, each pool: one per CPU unless told (cowfs mount --workers)
        self.workers = workers or os.cpu_count() or 2
        self.executor = named_pool("cowfs-chunk", chunk_workers or self.workers)
        # a write batch's native calls run on the cores the batches running at once leave idle
        self.batch_threads = BatchThreads(self.workers)
        # reads ahead for sequential readers (FileReader), so a window is read while the last is served
        self.readahead = named_pool("cowfs-readahead", self.workers)
        self.window_buffers = window_pool(WINDOW_BUFFER, keep=8)  # reused read windows (reader.py)
        self._sessions: dict[int, WriteSession] = {}
        self.holds = Holds()  # what open readers and sessions use (holds.py)
        self._session_holds: dict[int, Callable[[], None]] = {}
        self._mutex = threading.RLock()
        self.events = EventBus()
        self.maintenance = threading.Lock()  # gc and fsck, one at a time
        self._compacting = threading.Lock()  # the compactor, one run at a time
        self.closed = False

    # -- lifecycle -----------------------------------------------------------------

    @staticmethod
    def init(path: str | os.PathLike, device: str = DEFAULT_DEVICE, segment_size: int = DEFAULT_SEGMENT_SIZE,
             read_chain: int = MAX_CHAIN) -> StoreConfig:
        root = Path(path)
        check_new_store_dir(root)
        cfg = new_config(device, segment_size, read_chain)
        if root.exists():  # an empty directory the user made: build in place, config last
            create_catalog(root / CATALOG_FILE, cfg.store_uuid)
            write_config(root, cfg)
            return cfg
        # build beside it and rename: a crash leaves no half-made store at the path
        root.parent.mkdir(parents=True, exist_ok=True)
        tmp = root.parent / f".{root.name}.cowfs-init-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            create_catalog(tmp / CATALOG_FILE, cfg.store_uuid)
            write_config(tmp, cfg)
            os.rename(tmp, root)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return cfg

    @classmethod
    def open(cls, path: str | os.PathLike, workers: int | None = None,
             pack_reader: Callable[[Path], PackReader] | None = None) -> "Store":
        """Open (and lock) a store; `workers`: threads per pool for per-byte work (default:
        one per CPU); `pack_reader`: makes the reader of evicted segments (the remote tier's
        `remote.evicted_reads.bucket_pack_reader`), called at the first read of one."""
        root = Path(path).absolute()
        config = read_config(root)
        fd = take_lock(root, "store")
        try:
            return cls(root, config, fd, workers, pack_reader)
        except BaseException:
            os.ftruncate(fd, 0)  # no process holds the store: leave no pid behind
            os.close(fd)
            raise

    def close(self) -> None:
        if self.closed:
            return
        for session in list(self._sessions.values()):
            session.close()
        self.executor.shutdown(wait=True)
        self.readahead.shutdown(wait=True, cancel_futures=True)
        self.log.close()
        self.catalog.close()
        os.ftruncate(self._lock_fd, 0)
        os.close(self._lock_fd)
        self.closed = True

    def replace_catalog(self, new: Path) -> None:
        """Swap in a catalog rebuilt by fsck --repair (nothing else may use the store meanwhile)."""
        self.catalog.close()  # checkpoints and removes its WAL
        for suffix in ("-wal", "-shm"):  # an old WAL must never be replayed into the new file
            (self.root / (CATALOG_FILE + suffix)).unlink(missing_ok=True)
        os.replace(new, self.root / CATALOG_FILE)
        fsync_dir(self.root)
        self.catalog = Catalog(self.root / CATALOG_FILE)
        self.index = ChunkIndex(self.catalog)
        self.capabilities_stored = self.catalog.read(xattrs.any_capability)

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _new_segment_id(self) -> int:
        def fn(txn: Txn) -> int:
            seg_id = int(txn.execute("SELECT value FROM meta WHERE key='next_segment'").fetchone()[0])
            txn.execute("UPDATE meta SET value=? WHERE key='next_segment'", (seg_id + 1,))
            txn.execute("INSERT INTO segments VALUES (?, 0, ?)", (seg_id, txn.now_ns))
            return seg_id

        return self.catalog.write(fn, op="segment")

    # -- reads of the tree -------------------------------------------------------------

    def _read(self, fn: Callable[..., T], gen: int | None) -> T:
        def run(conn):  # type: ignore[no-untyped-def]
            return fn(conn, ns.current_gen(conn) if gen is None else gen)

        return self.catalog.read(run)

    @property
    def generation(self) -> int:
        return self.catalog.read(ns.current_gen)

    def observe_generation(self, gen: int) -> bool:
        """Move the generation counter to at least `gen`, another store's (a Lamport clock:
        every later change here gets a higher generation than the change seen there). No
        generation row, no event; committed without its own fsync (the next durable commit
        makes it durable, before any change that it orders). True if it moved."""
        def fn(txn: Txn) -> bool:
            return txn.execute("UPDATE meta SET value=? WHERE key='generation' AND value < ?", (gen, gen)).rowcount > 0

        return self.catalog.write(fn, op="clock", durable=False)

    def getattr(self, ino: int, gen: int | None = None) -> Attr:
        return self._read(lambda c, g: ns.getattr_(c, ino, g), gen)

    def lookup(self, parent: int, name: bytes, gen: int | None = None) -> Attr:
        return self._read(lambda c, g: ns.lookup(c, parent, name, g), gen)

    def readdir(self, ino: int, gen: int | None = None) -> list[tuple[bytes, Attr]]:
        return self._read(lambda c, g: ns.readdir(c, ino, g), gen)

    def readlink(self, ino: int, gen: int | None = None) -> bytes:
        return self._read(lambda c, g: ns.readlink(c, ino, g), gen)

    def resolve(self, path: str | bytes, gen: int | None = None) -> Attr:
        return self._read(lambda c, g: ns.resolve(c, path, g), gen)

    def may_have_xattr(self, name: bytes) -> bool:
        """False when no inode has extended attribute `name`, known without a query (only for
        security.capability, which the kernel asks for before every write)."""
        return name != xattrs.CAPABILITY or self.capabilities_stored

    def getxattr(self, ino: int, name: bytes, gen: int | None = None) -> bytes:
        return xattrs.read(self._read(lambda c, g: ns.version_row_or_fail(c, ino, g).xattrs, gen), name)

    def listxattr(self, ino: int, gen: int | None = None) -> list[bytes]:
        return sorted(xattrs.decode(self._read(lambda c, g: ns.version_row_or_fail(c, ino, g).xattrs, gen)))

    def paths_of(self, ino: int, gen: int | None = None) -> list[str]:
        return self.catalog.read(lambda c: ns.paths_of(c, ino, gen))

    # -- changes to the tree -----------------------------------------------------------

    def _change(self, op: str, fn: Callable[[Txn], T], describe: Callable[[Txn, T], list[Event]] | None = None,
                durable: bool = True) -> T:
        """Run `fn` as one transaction; `describe` names the change for event subscribers
        (run in the same transaction, only when someone listens; published once durable).
        Not `durable` (only without listeners): see Catalog.write."""
        if describe is None or not self.events.active:
            return self.catalog.write(fn, op=op, durable=durable)
        events: list[Event] = []

        def with_events(txn: Txn) -> T:
            result = fn(txn)
            events[:] = describe(txn, result)
            return result

        result = self.catalog.write(with_events, op=op)
        self.events.publish(events)
        return result

    # -- file data ------------------------------------------------------------------------

    def read_chunk(self, chunk: bytes, loc: Location) -> bytes:
        return self.log.read_chunk(loc, chunk)

    def open_reader(self, ino: int, gen: int | None = None) -> FileReader:
        """A reader of the version current at `gen`; it stays readable while open, even if deleted."""

        def fn(conn, g):  # type: ignore[no-untyped-def]
            attr = ns.getattr_(conn, ino, g)
            if attr.is_dir:
                raise IsADirectory(f"inode {ino} is a directory")
            return attr, load_extents(conn, attr.content_id, VersionId(attr.ino, attr.vid, attr.birth_gen))

        with self.index.gc_lock.shared():  # gc cannot drop the body between loading and holding it
            attr, extents = self._read(fn, gen)
            release = self.holds.hold(attr.content_id)
        return self.body_reader(extents, attr.size, release, VersionId(attr.ino, attr.vid, attr.birth_gen))

    def body_reader(self, extents: list[Extent], size: int, on_close: Callable[[], None] | None = None,
                    version: VersionId | None = None) -> FileReader:
        """A reader of a body's extents (the caller holds the body: holds.py)."""
        return FileReader(extents, size, self.log.read_run, check_chunk, on_close, version,
                          prefetch=self.readahead.submit, advise=self.log.will_need, buffers=self.window_buffers,
                          decode=self.log.decode_many, ahead_limit=min(MOST_AHEAD, 2 * self.workers))

    def open_session(self, ino: int) -> "SessionHandle":
        """Start a write session on a regular file (one per file at a time)."""
        def fn(conn, g):  # type: ignore[no-untyped-def]
            attr = ns.getattr_(conn, ino, g)
            if not attr.is_file:
                raise IsADirectory(f"inode {ino} is not a regular file")
            return attr, load_extents(conn, attr.content_id)

        # lock order everywhere: gc_lock, then _mutex (open_reader and gc take them so too);
        # the catalog read under gc_lock only, so _mutex (which the FUSE thread takes in
        # open_created_session) is never held across a read
        with self.index.gc_lock.shared():
            attr, extents = self._read(fn, None)
            with self._mutex:
                if ino in self._sessions:
                    raise Busy(f"inode {ino} already has a write session")
                return SessionHandle(self._new_session(ino, attr.content_id, extents, attr.size))

    def open_created_session(self, attr: Attr) -> WriteSession:
        """The write session of a file this caller just created (`attr`: its empty first
        version, as the create returned it): nothing to load, and nothing gc could drop
        meanwhile, so no catalog read and no gc_lock (the FUSE thread calls it)."""
        if attr.size != 0 or attr.content_id is not None or not attr.is_file:
            raise InvalidArgument(f"inode {attr.ino} is not a file just created")
        with self._mutex:
            if attr.ino in self._sessions:
                raise Busy(f"inode {attr.ino} already has a write session")
            return self._new_session(attr.ino, None, [], 0)

    def _new_session(self, ino: int, content_id: int | None, extents: list[Extent], size: int,
                     commit_fn: Callable[[WriteSession, list[Extent]], tuple[Attr | None, list[Extent]]] | None = None
                     ) -> WriteSession:
        """(under _mutex) A session from its base version, held and registered. With `commit_fn`
        (a file not made yet, `ino` 0: TreeChanges.create_filled) neither, so no _mutex needed:
        the session is the caller's alone and `commit_fn` commits it."""
        from .tensors.write_layout import WriteLayout  # here: most commands never write (0.08 s of start-up)
        session = WriteSession(ino, extents, size, self.log, self.index, self.executor, self.root / SPILL_DIR,
                               self.read_chunk, commit_fn or self._commit_version, self._session_closed,
                               self.batch_threads, new_layout=WriteLayout)
        if commit_fn is None:
            self._session_holds[ino], self._sessions[ino] = self.holds.hold(content_id), session
        return session

    def session_of(self, ino: int) -> WriteSession | None:
        return self._sessions.get(ino)

    def _session_closed(self, session: WriteSession) -> None:
        release = None
        with self._mutex:
            if self._sessions.get(session.ino) is session:
                del self._sessions[session.ino]
                release = self._session_holds.pop(session.ino, None)
        if release is not None:
            release()

    def _commit_version(self, session: WriteSession, extents: list[Extent]) -> tuple[Attr | None, list[Extent]]:
        """Durability point: data records first (sync), then one catalog transaction (commit.py)."""
        self.log.sync()
        ino, size, mtime_ns = session.ino, session.size, session.mtime_ns

        def fn(txn: Txn) -> tuple[Attr | None, list[Extent]]:
            return commit_version(txn, ino, size, mtime_ns, extents)

        attr, stored = self._change("commit", fn, lambda t, r: version_events(t, r[0]))
        if attr is not None:  # the session goes on from the new body: hold it instead of the old one
            new_hold = self.holds.hold(attr.content_id)
            with self._mutex:
                old_hold = self._session_holds.get(session.ino)
                self._session_holds[session.ino] = new_hold
            if old_hold is not None:
                old_hold()
        return attr, stored

    # -- conveniences for the CLI and tests --------------------------------------------------

    def read_file(self, path: str | bytes, gen: int | None = None) -> bytes:
        attr = self.resolve(path, gen)
        with self.open_reader(attr.ino, gen) as r:
            return bytes(r.read(0, r.size))

    def write_file(self, path: str | bytes, data: bytes, mode: int = 0o644) -> Attr:
        raw = path.encode() if isinstance(path, str) else path
        head, _, name = raw.strip(b"/").rpartition(b"/")
        parent = self.resolve(head)
        try:
            attr = self.lookup(parent.ino, name)
        except NotFound:
            attr = self.create(parent.ino, name, mode)
        with self.open_session(attr.ino) as s:
            s.truncate(0)
            s.write(0, data)
            result = s.commit()
        return result if result is not None else self.getattr(attr.ino)

    # -- maintenance ------------------------------------------------------------------------

    def physical_bytes(self) -> int:
        return physical_bytes(self.root)

    def load_decoders(self) -> None:
        """Import numpy and Blosc2 (0.5 CPU s) now if a body was compacted, not at its first read."""
        if self.catalog.read(any_compacted):
            load_codec_libraries()

    def stats(self) -> dict[str, float | int]:
        return report(self.catalog.read(catalog_stats), self.physical_bytes())

    def gc(self, progress: Callable[[int, int], None] | None = None) -> GcReport:
        with self.maintenance:
            return collect(self, progress)

    def compact(self, progress: Callable[[int, int], None] | None = None, stop: Callable[[], bool] | None = None,
                workers: int | None = None) -> CompactReport:
        """Re-cut and encode the bodies not compacted yet (compact.py); one run at a time.
        A run that replaced anything and was not stopped then gives back what it replaced
        (the old bodies' chunks and the records re-encoded in place: a gc), so that the
        stored bytes after it are the truth; `report.gc_*` say what that freed."""
        from .tensors.compact import compact  # imported here: most commands never compact (0.05 s of start-up)

        with self._compacting:
            report = compact(self, progress, stop, workers)
        if not report.stopped and (report.recut or report.rewritten or report.deltas or report.regrouped):
            freed = self.gc()
            report.gc_chunks_deleted, report.gc_bytes_freed = freed.chunks_deleted, freed.bytes_freed
        return report

    def fsck(self, repair: bool = False, progress: Callable[[int, int], None] | None = None) -> FsckReport:
        with self.maintenance:  # never beside gc: gc would punch records fsck is reading
            return check(self, repair=repair, progress=progress)
