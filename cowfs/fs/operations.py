"""pyfuse3 Operations: translate each FUSE request to one Store call.

Handlers run on the trio thread. Anything that may wait on the disk or the
catalog writer (namespace changes, commits, opens that load extent lists, reads
of chunk data, snapshots) runs in a worker thread; in-memory work (session
writes into the stream buffer, attribute lookups on the read connection) runs
inline. See docs/design.md, "The FUSE layer".
"""
from __future__ import annotations

import errno
import functools
import logging
import os
import stat
from typing import Any, Awaitable, Callable, TypeVar

import pyfuse3
import trio

from ..errors import CowfsError, NotFound, ReadOnly
from ..store import Attr, Store
from ..store.store import validate_snapshot_name
from .handles import HandleTable, OpenFile
from .openers import holds_writable
from .views import LIVE_VIEW, SNAPDIR_INO, SNAPDIR_NAME, View, ViewTable

log = logging.getLogger("cowfs.fs")
T = TypeVar("T")

LIVE_TIMEOUT = 1.0
SNAPSHOT_TIMEOUT = 300.0


def translate_errors(fn: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
    """Engine errors become their errno; anything unexpected is logged and becomes EIO
    (any other exception would make pyfuse3 end the whole filesystem)."""

    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> T:
        try:
            return await fn(*args, **kwargs)
        except pyfuse3.FUSEError:
            raise
        except CowfsError as e:
            if e.errno == errno.EIO:
                log.error("%s: %s", fn.__name__, e)
            raise pyfuse3.FUSEError(e.errno) from None
        except OSError as e:
            log.error("%s: %s", fn.__name__, e)
            raise pyfuse3.FUSEError(e.errno or errno.EIO) from None
        except Exception:
            log.exception("unexpected error in %s", fn.__name__)
            raise pyfuse3.FUSEError(errno.EIO) from None

    return wrapper


async def in_thread(fn: Callable[..., T], *args: Any) -> T:
    return await trio.to_thread.run_sync(functools.partial(fn, *args))


class CowfsOperations(pyfuse3.Operations):
    enable_writeback_cache = True

    def __init__(self, store: Store) -> None:
        super().__init__()
        self.store = store
        self.views = ViewTable()
        self.handles = HandleTable(store)
        self._dirs: dict[int, list[tuple[bytes, pyfuse3.EntryAttributes]]] = {}
        self._writer_open_lock = trio.Lock()
        self.mount_id: int | None = None  # set once mounted; enables the forked-copy check at FLUSH
        self._dir_ids = 0

    # -- attributes --------------------------------------------------------------

    def _entry(self, view: View, attr: Attr) -> pyfuse3.EntryAttributes:
        e = pyfuse3.EntryAttributes()
        e.st_ino = ViewTable.encode(view, attr.ino)
        e.generation = 0
        timeout = LIVE_TIMEOUT if view.live else SNAPSHOT_TIMEOUT
        e.entry_timeout = timeout
        e.attr_timeout = timeout
        e.st_mode = attr.mode
        e.st_nlink = attr.nlink
        e.st_uid = attr.uid
        e.st_gid = attr.gid
        e.st_rdev = 0
        size = attr.size
        if view.live:
            session = self.handles.session(attr.ino)
            if session is not None:
                size = session.size
        e.st_size = size
        e.st_blksize = 1 << 16
        e.st_blocks = (size + 511) // 512
        e.st_atime_ns = attr.mtime_ns
        e.st_mtime_ns = attr.mtime_ns
        e.st_ctime_ns = attr.ctime_ns
        return e

    def _snapdir_entry(self) -> pyfuse3.EntryAttributes:
        snaps = self.store.snapshot_list()
        root = self.store.getattr(1)
        e = pyfuse3.EntryAttributes()
        e.st_ino = SNAPDIR_INO
        e.entry_timeout = e.attr_timeout = 0
        e.st_mode = stat.S_IFDIR | 0o755
        e.st_nlink = 2 + len(snaps)
        e.st_uid, e.st_gid = root.uid, root.gid
        newest = max((s.created_ns for s in snaps), default=root.ctime_ns)
        e.st_atime_ns = e.st_mtime_ns = e.st_ctime_ns = newest
        e.st_blksize = 4096
        return e

    def _decode(self, fuse_ino: int) -> tuple[View, int]:
        try:
            return self.views.decode(fuse_ino)
        except KeyError:
            raise pyfuse3.FUSEError(errno.ENOENT) from None

    def _live(self, fuse_ino: int) -> int:
        if fuse_ino == SNAPDIR_INO:
            raise pyfuse3.FUSEError(errno.EPERM)
        view, ino = self._decode(fuse_ino)
        if not view.live:
            raise ReadOnly("snapshots are read-only")
        return ino

    def _snapshot_view(self, name: bytes) -> View:
        snap = self.store.snapshot(name.decode(errors="surrogateescape"))
        return self.views.for_snapshot(snap.name, snap.gen)

    @translate_errors
    async def lookup(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        if parent_inode == pyfuse3.ROOT_INODE and name == SNAPDIR_NAME:
            return self._snapdir_entry()
        if parent_inode == SNAPDIR_INO:
            view = self._snapshot_view(name)
            return self._entry(view, self.store.getattr(1, view.gen))
        view, ino = self._decode(parent_inode)
        return self._entry(view, self.store.lookup(ino, name, view.gen))

    @translate_errors
    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        if inode == SNAPDIR_INO:
            return self._snapdir_entry()
        view, ino = self._decode(inode)
        try:
            return self._entry(view, self.store.getattr(ino, view.gen))
        except NotFound:
            # unlinked but still open: the kernel may still ask until FORGET
            for f in self.handles.files.values():
                if f.fuse_ino == inode and f.attr is not None:
                    return self._entry(view, f.attr)
            raise

    @translate_errors
    async def setattr(self, inode: int, attr: pyfuse3.EntryAttributes, fields: pyfuse3.SetattrFields,
                      fh: int | None, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        ino = self._live(inode)
        if fields.update_size:
            session = self.handles.session(ino)
            if session is not None:
                session.truncate(attr.st_size)
            else:
                await in_thread(lambda: self.store.setattr(ino, size=attr.st_size))
        mode = attr.st_mode if fields.update_mode else None
        uid = attr.st_uid if fields.update_uid else None
        gid = attr.st_gid if fields.update_gid else None
        mtime = attr.st_mtime_ns if fields.update_mtime else None
        session = self.handles.dirty_session(ino)
        if mtime is not None and session is not None and mode is None and uid is None and gid is None:
            # the kernel's mtime update before a close (writeback cache): it goes into the
            # version the coming FLUSH commits, not into a catalog transaction of its own
            session.mtime_ns = mtime
            mtime = None
        if mode is not None or uid is not None or gid is not None or mtime is not None:
            new = await in_thread(lambda: self.store.setattr(ino, mode=mode, uid=uid, gid=gid, mtime_ns=mtime))
        else:
            new = self.store.getattr(ino)
        return self._entry(LIVE_VIEW, new)

    @translate_errors
    async def readlink(self, inode: int, ctx: pyfuse3.RequestContext) -> bytes:
        view, ino = self._decode(inode)
        return self.store.readlink(ino, view.gen)

    @translate_errors
    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        st = os.statvfs(self.store.root)
        s = pyfuse3.StatvfsData()
        s.f_bsize, s.f_frsize = st.f_bsize, st.f_frsize
        s.f_blocks, s.f_bfree, s.f_bavail = st.f_blocks, st.f_bfree, st.f_bavail
        s.f_files, s.f_ffree, s.f_favail = st.f_files, st.f_ffree, st.f_favail
        s.f_namemax = 255
        return s

    # -- directories -----------------------------------------------------------------

    @translate_errors
    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        if inode == SNAPDIR_INO:
            entries = []
            for snap in self.store.snapshot_list():
                view = self.views.for_snapshot(snap.name, snap.gen)
                entries.append((snap.name.encode(), self._entry(view, self.store.getattr(1, view.gen))))
        else:
            view, ino = self._decode(inode)
            listing = await in_thread(self.store.readdir, ino, view.gen)
            entries = [(name, self._entry(view, attr)) for name, attr in listing]
        self._dir_ids += 1
        self._dirs[self._dir_ids] = entries
        return self._dir_ids

    @translate_errors
    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        entries = self._dirs.get(fh, [])
        for i in range(start_id, len(entries)):
            name, entry = entries[i]
            if not pyfuse3.readdir_reply(token, name, entry, i + 1):
                break

    @translate_errors
    async def releasedir(self, fh: int) -> None:
        self._dirs.pop(fh, None)

    @translate_errors
    async def mkdir(self, parent_inode: int, name: bytes, mode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        if parent_inode == SNAPDIR_INO:
            snap_name = name.decode(errors="surrogateescape")
            validate_snapshot_name(snap_name)
            snap = await in_thread(self.store.snapshot_create, snap_name)
            view = self.views.for_snapshot(snap.name, snap.gen)
            return self._entry(view, self.store.getattr(1, view.gen))
        parent = self._live(parent_inode)
        attr = await in_thread(self.store.mkdir, parent, name, mode & ~ctx.umask, ctx.uid, ctx.gid)
        return self._entry(LIVE_VIEW, attr)

    @translate_errors
    async def rmdir(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        if parent_inode == SNAPDIR_INO:
            await in_thread(self.store.snapshot_delete, name.decode(errors="surrogateescape"))
            return
        parent = self._live(parent_inode)
        await in_thread(self.store.rmdir, parent, name)

    @translate_errors
    async def symlink(self, parent_inode: int, name: bytes, target: bytes, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        parent = self._live(parent_inode)
        attr = await in_thread(self.store.symlink, parent, name, target, ctx.uid, ctx.gid)
        return self._entry(LIVE_VIEW, attr)

    @translate_errors
    async def unlink(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        parent = self._live(parent_inode)
        await in_thread(self.store.unlink, parent, name)

    @translate_errors
    async def rename(self, parent_inode_old: int, name_old: bytes, parent_inode_new: int, name_new: bytes,
                     flags: int, ctx: pyfuse3.RequestContext) -> None:
        if flags & pyfuse3.RENAME_EXCHANGE:
            raise pyfuse3.FUSEError(errno.EINVAL)
        old = self._live(parent_inode_old)
        new = self._live(parent_inode_new)
        noreplace = bool(flags & pyfuse3.RENAME_NOREPLACE)
        await in_thread(self.store.rename, old, name_old, new, name_new, noreplace)

    @translate_errors
    async def link(self, inode: int, new_parent_inode: int, new_name: bytes, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        raise pyfuse3.FUSEError(errno.EPERM)  # hard links are not supported

    @translate_errors
    async def mknod(self, parent_inode: int, name: bytes, mode: int, rdev: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        if not stat.S_ISREG(mode):
            raise pyfuse3.FUSEError(errno.EPERM)  # only regular files
        parent = self._live(parent_inode)
        attr = await in_thread(self.store.create, parent, name, mode & 0o7777 & ~ctx.umask, ctx.uid, ctx.gid)
        return self._entry(LIVE_VIEW, attr)

    # -- files -------------------------------------------------------------------------

    async def _open_writer(self, fuse_ino: int, ino: int, truncate: bool, pid: int) -> OpenFile:
        async with self._writer_open_lock:  # one session per inode, even when opens race
            session = None
            if self.handles.session(ino) is None:
                session = (await in_thread(self.store.open_session, ino)).session
            f = self.handles.open_writer(fuse_ino, ino, session)
        f.attr = self.store.getattr(ino)
        f.opener_pid = pid
        if truncate:
            f.shared.session.truncate(0)  # type: ignore[union-attr]
        return f

    @translate_errors
    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        if inode == SNAPDIR_INO:
            raise pyfuse3.FUSEError(errno.EISDIR)
        view, ino = self._decode(inode)
        writable = flags & (os.O_WRONLY | os.O_RDWR) != 0
        if writable:
            if not view.live:
                raise pyfuse3.FUSEError(errno.EROFS)
            f = await self._open_writer(inode, ino, bool(flags & os.O_TRUNC), ctx.pid)
            return pyfuse3.FileInfo(fh=f.fh, keep_cache=True)
        # With the writeback cache a writer's uncommitted bytes live in the kernel's page cache of
        # the inode, shared by every open: while a writer has the file open, a new reader bypasses
        # that cache and reads the committed version from the log.
        pending = view.live and self.handles.session(ino) is not None
        reader = await in_thread(self.store.open_reader, ino, view.gen)
        f = self.handles.open_reader(inode, ino, reader)
        f.attr = await in_thread(self.store.getattr, ino, view.gen)
        return pyfuse3.FileInfo(fh=f.fh, direct_io=pending, keep_cache=not view.live)

    @translate_errors
    async def create(self, parent_inode: int, name: bytes, mode: int, flags: int,
                     ctx: pyfuse3.RequestContext) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        parent = self._live(parent_inode)
        attr = await in_thread(self.store.create, parent, name, mode & 0o7777 & ~ctx.umask, ctx.uid, ctx.gid)
        fuse_ino = ViewTable.encode(LIVE_VIEW, attr.ino)
        f = await self._open_writer(fuse_ino, attr.ino, False, ctx.pid)
        return pyfuse3.FileInfo(fh=f.fh, keep_cache=True), self._entry(LIVE_VIEW, attr)

    @translate_errors
    async def read(self, fh: int, off: int, size: int) -> bytes:
        f = self.handles.files[fh]
        return await in_thread(f.read, off, size)

    @translate_errors
    async def write(self, fh: int, off: int, buf: bytes) -> int:
        f = self.handles.files[fh]
        if f.shared is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        return f.shared.session.write(off, buf)

    async def _commit(self, f: OpenFile) -> None:
        if f.shared is None or not f.shared.session.dirty:
            return
        attr = await in_thread(f.shared.session.commit)
        if attr is not None:
            f.attr = attr
            log.debug("committed inode %d: %d bytes at generation %d", f.store_ino, attr.size, attr.birth_gen)

    @translate_errors
    async def flush(self, fh: int) -> None:
        # close() waits for FLUSH, not RELEASE: the new version must be durable here
        f = self.handles.files[fh]
        if f.shared is None or not f.shared.session.dirty:
            return
        if self.mount_id is not None and f.opener_pid and await in_thread(
            holds_writable, f.opener_pid, self.mount_id, f.fuse_ino
        ):
            # the opener still holds the file open: this FLUSH is from a copy of its
            # descriptor (a forked child closing or exec'ing), not the writer's close
            log.debug("flush of inode %d from a descriptor copy: not committing", f.store_ino)
            return
        await self._commit(f)

    @translate_errors
    async def fsync(self, fh: int, datasync: bool) -> None:
        await self._commit(self.handles.files[fh])

    @translate_errors
    async def release(self, fh: int) -> None:
        f = self.handles.files[fh]
        try:
            await self._commit(f)  # e.g. pages of a writable mmap written back after close
        finally:
            _, last = self.handles.close(fh)
            if last is not None:
                last.close()  # committed already: this only drops pins, so it is quick and stays
                # on this thread, leaving no moment where the table and the store disagree

    # -- lifecycle ------------------------------------------------------------------------

    async def commit_all(self) -> None:
        """Commit every open write session (unmount, SIGTERM)."""
        for shared in list(self.handles.sessions.values()):
            if shared.session.dirty:
                try:
                    await in_thread(shared.session.commit)
                except Exception:
                    log.exception("commit of inode %d at shutdown failed", shared.session.ino)
