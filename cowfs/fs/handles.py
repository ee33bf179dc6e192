"""Open files: read handles on a committed version, write handles sharing one session per inode."""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

import trio

from ..store import Attr, Store
from ..store.data.reader import FileReader
from ..store.data.session import WriteSession


@dataclass
class SharedSession:
    session: WriteSession
    handles: set[int] = field(default_factory=set)
    # errno of a WRITE or commit that failed: the kernel has dropped those pages or told the
    # writer, so nothing more of this session is committed (see operations.py, _session_failed)
    error: int | None = None
    # when a truncate through the session changed the file (the kernel leaves mtime and ctime
    # of a size change to the file system): stat shows it until the commit's own times
    truncated_ns: int | None = None
    # held while a put (fs/put_op.py) writes into the session: a FLUSH, fsync, RELEASE or WRITE
    # of the file waits for it, so no commit ever takes a put's parts before its last one
    put_lock: trio.Lock = field(default_factory=trio.Lock)
    # WRITEs of the file in the order they arrived (trio's Lock is fair): one that waits for
    # its session's batch keeps the later ones waiting behind it rather than letting them
    # overtake it, so the stream sees the order the kernel sent
    write_order: trio.Lock = field(default_factory=trio.Lock)


@dataclass
class OpenFile:
    fh: int
    fuse_ino: int
    store_ino: int
    writable: bool
    reader: FileReader | None = None  # read-only handles
    shared: SharedSession | None = None  # writable handles
    attr: Attr | None = None  # last known attributes, served after an unlink until release
    opener_pid: int = 0  # the process (thread) that opened it
    lazy_seq: int = 0  # created by this handle, its catalog commit not yet durable: Catalog.make_durable(lazy_seq)

    def read(self, offset: int, size: int) -> bytes | memoryview:
        if self.shared is not None:
            return self.shared.session.read(offset, size)
        assert self.reader is not None
        return self.reader.read(offset, size)


class HandleTable:
    """Open files and shared sessions. Used only from the trio thread."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._ids = itertools.count(1)
        self.files: dict[int, OpenFile] = {}
        self.sessions: dict[int, SharedSession] = {}  # store ino -> session
        # A snapshot of now (an auto-snapshot, or a checkpoint snapshot that had to wait: see
        # fs/snapshot_tasks.py) must never show a file between its create (the empty entry is
        # committed first) and its close: creates in progress are counted, and a create
        # waits while such a snapshot is being taken (auto_snapshot_done is then set).
        self.creating = 0
        self.auto_snapshot_done: trio.Event | None = None
        # for the idle compactor (idle_compaction.py): when the last writable handle closed,
        # and how many have closed (compacted_seq: how many the last full compaction had seen)
        self.last_write_end = time.monotonic()
        self.write_seq = 0
        self.compacted_seq = -1  # a store mounted with files never compacted: look once
        self.unmounting = False  # set once the daemon stops serving: the compactor stops at its next step

    def open_reader(self, fuse_ino: int, store_ino: int, reader: FileReader) -> OpenFile:
        f = OpenFile(next(self._ids), fuse_ino, store_ino, False, reader=reader)
        self.files[f.fh] = f
        return f

    def open_writer(self, fuse_ino: int, store_ino: int, new_session: WriteSession | None = None) -> OpenFile:
        """A writable handle on the inode's shared session (`new_session` if there is none yet)."""
        shared = self.sessions.get(store_ino)
        if shared is None:
            assert new_session is not None
            shared = SharedSession(new_session)
            self.sessions[store_ino] = shared
        f = OpenFile(next(self._ids), fuse_ino, store_ino, True, shared=shared)
        shared.handles.add(f.fh)
        self.files[f.fh] = f
        return f

    def writers_open(self) -> bool:
        """A file is open for writing, or being created."""
        return bool(self.sessions) or self.creating > 0

    def dirty_session(self, store_ino: int) -> WriteSession | None:
        shared = self.sessions.get(store_ino)
        return shared.session if shared is not None and shared.session.dirty else None

    def session(self, store_ino: int) -> WriteSession | None:
        shared = self.sessions.get(store_ino)
        return shared.session if shared is not None else None

    def close(self, fh: int) -> tuple[OpenFile, WriteSession | None]:
        """Forget a handle; returns the session if this was its last handle (the caller commits and closes it)."""
        f = self.files.pop(fh)
        last = None
        if f.shared is not None:
            self.last_write_end = time.monotonic()
            self.write_seq += 1
            f.shared.handles.discard(fh)
            if not f.shared.handles:
                self.sessions.pop(f.store_ino, None)
                last = f.shared.session
        elif f.reader is not None:
            f.reader.close()
        return f, last
