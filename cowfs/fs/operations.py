"""pyfuse3 Operations: translate each FUSE request to one Store call.

Handlers run on the trio thread. Anything that may wait on the disk or the
catalog writer (namespace changes, commits, opens that load extent lists, reads
of chunk data, snapshots) runs in a worker thread, except a create, whose catalog
change this thread queues and awaits without one (`wait_future`); in-memory work
(session writes into the stream buffer, attribute lookups on the read connection)
runs inline. See docs/design.md, "The FUSE layer".
"""
from __future__ import annotations

import errno
import logging
import os
import stat
import time
from dataclasses import replace

import pyfuse3
import trio

from ..errors import CorruptData, CowfsError, NotFound, ReadOnly
from ..store import Attr, Store
from ..store.catalog.snapshots import validate_snapshot_name
from ..store.data.reader import FileReader
from ..store.data.session import WriteSession
from .attrs import entry_of, snapdir_entry, statfs_of
from .corrupt_log import CorruptLog
from .dispatch import in_thread, translate_errors, wait_future
from .handles import HandleTable, OpenFile, SharedSession
from .openers import holds_writable
from .views import LIVE_VIEW, SNAPDIR_INO, SNAPDIR_NAME, View, ViewTable
from .xattr_ops import XattrOperations

log = logging.getLogger("cowfs.fs")
HELD = object()  # _commit_unless_held: the opener still holds the file open, nothing committed


def _commit_unless_held(session: WriteSession, held: tuple[int, int, int] | None) -> "Attr | None | object":
    """(worker thread) Commit, unless `held` (opener pid, mount id, FUSE inode) says the
    opener still holds a writable descriptor on the file: then HELD."""
    if held is not None and holds_writable(*held):
        return HELD
    return session.commit()


async def _after_put(shared: SharedSession | None) -> None:
    """Wait until no put writes into the session (fs/put_op.py)."""
    if shared is not None and shared.put_lock.locked():
        async with shared.put_lock:
            pass


class CowfsOperations(XattrOperations, pyfuse3.Operations):
    # Off by default (cowfs mount --writeback-cache turns it on): without it the kernel sends
    # a file's writes in the order the program made them, which keeps a checkpoint save on
    # the streaming path (chunked while it is written); with it, writeback reorders pages,
    # the session spills them and re-chunks the file inside fsync. docs/benchmarks.md.
    enable_writeback_cache = False

    def __init__(self, store: Store) -> None:
        super().__init__()
        self.store = store
        self.views = ViewTable()
        self.handles = HandleTable(store)
        self._dirs: dict[int, list[tuple[bytes, pyfuse3.EntryAttributes]]] = {}
        self._writer_open_lock = trio.Lock()
        self.mount_id: int | None = None  # set once mounted; enables the forked-copy check at FLUSH
        self._dir_ids = 0
        self.corrupt_log = CorruptLog(self.store_of)

    # -- attributes --------------------------------------------------------------

    def _entry(self, view: View, attr: Attr) -> pyfuse3.EntryAttributes:
        return entry_of(view, attr, self.handles.sessions.get(attr.ino) if view.live else None)

    def _known(self, view: View, attr: Attr) -> pyfuse3.EntryAttributes:
        """The entry of a reply the kernel counts a lookup of (holds.py: known inodes)."""
        if view.live:
            self.store.holds.refer_inode(attr.ino)
        return self._entry(view, attr)

    def _snapdir_entry(self) -> pyfuse3.EntryAttributes:
        return snapdir_entry(self.store)

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
        if view.live:
            return self._entry(view, self.store.holds.looked_up(lambda: self.store.lookup(ino, name, None)))
        return self._entry(view, self.store.lookup(ino, name, view.gen))

    async def forget(self, inode_list: list[tuple[int, int]]) -> None:
        self.store.holds.forget_inodes([(i, n) for i, n in inode_list if ViewTable.is_live(i)])

    @translate_errors
    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        if inode == SNAPDIR_INO:
            return self._snapdir_entry()
        view, ino = self._decode(inode)
        try:
            return self._entry(view, self.store_of(view).getattr(ino, view.gen))
        except NotFound:
            # unlinked but still open: the kernel may still ask until FORGET
            for f in self.handles.files.values():
                if f.fuse_ino == inode and f.attr is not None:
                    return self._entry(view, replace(f.attr, nlink=0))  # no name left, as on ext4
            raise

    @translate_errors
    async def setattr(self, inode: int, attr: pyfuse3.EntryAttributes, fields: pyfuse3.SetattrFields,
                      fh: int | None, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        ino = self._live(inode)
        if fields.update_size:
            shared = self.handles.sessions.get(ino)
            await _after_put(shared)
            shared = self.handles.sessions.get(ino)
            if shared is not None:
                shared.session.truncate(attr.st_size)
                shared.truncated_ns = time.time_ns()
            else:
                await in_thread(lambda: self.store.setattr(ino, size=attr.st_size))
        mode = attr.st_mode if fields.update_mode else None
        uid = attr.st_uid if fields.update_uid else None
        gid = attr.st_gid if fields.update_gid else None
        mtime = attr.st_mtime_ns if fields.update_mtime else None
        atime = attr.st_atime_ns if fields.update_atime else None
        session = self.handles.dirty_session(ino)
        if mtime is not None and session is not None and mode is None and uid is None and gid is None and atime is None:
            # the kernel's mtime update before a close (writeback cache): it goes into the
            # version the coming FLUSH commits, not into a catalog transaction of its own
            session.mtime_ns = mtime
            mtime = None
        try:
            if mode is not None or uid is not None or gid is not None or mtime is not None or atime is not None:
                new = await in_thread(lambda: self.store.setattr(ino, mode=mode, uid=uid, gid=gid, mtime_ns=mtime,
                                                                 atime_ns=atime))
            else:
                new = self.store.getattr(ino)
        except NotFound:
            if mode is not None or uid is not None or gid is not None:
                raise
            # removed by an unlink or a rename while the kernel still has the inode: it writes
            # back the times it cached (the unlink's ctime) at a close or later; they have
            # nowhere to go, and the answer is the inode as it was
            new = await in_thread(lambda: self.store.getattr(ino, self._gen_before_removal(ino)))
        return self._entry(LIVE_VIEW, new)

    @translate_errors
    async def readlink(self, inode: int, ctx: pyfuse3.RequestContext) -> bytes:
        view, ino = self._decode(inode)
        return self.store_of(view).readlink(ino, view.gen)

    @translate_errors
    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        return statfs_of(self.store.root)

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
            if ViewTable.is_live(entry.st_ino):
                self.store.holds.refer_inode(entry.st_ino)

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
        return self._known(LIVE_VIEW, attr)

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
        return self._known(LIVE_VIEW, attr)

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
        ino, parent = self._live(inode), self._live(new_parent_inode)
        return self._known(LIVE_VIEW, await in_thread(self.store.link, ino, parent, new_name))

    @translate_errors
    async def mknod(self, parent_inode: int, name: bytes, mode: int, rdev: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        parent = self._live(parent_inode)
        perms = mode & 0o7777 & ~ctx.umask
        if stat.S_ISREG(mode):
            attr = await in_thread(self.store.create, parent, name, perms, ctx.uid, ctx.gid)
        else:  # a fifo, socket or device node: metadata only
            attr = await in_thread(self.store.mknod, parent, name, stat.S_IFMT(mode) | perms, rdev, ctx.uid, ctx.gid)
        return self._known(LIVE_VIEW, attr)

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
            await _after_put(f.shared)
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
        try:
            reader, attr, _gen = await in_thread(self.committed_version, view, ino)
        except CorruptData as e:
            self.corrupt_log.report(view, ino, e, "open")
            raise pyfuse3.FUSEError(errno.EIO) from None
        f = self.handles.open_reader(inode, ino, reader)
        f.attr = attr
        return pyfuse3.FileInfo(fh=f.fh, direct_io=pending, keep_cache=view.gen is not None)  # a snapshot: immutable

    def store_of(self, view: View) -> Store:
        """The store whose inodes a view numbers (fs/union_ops.py adds the other nodes')."""
        return self.store

    def file_of(self, fuse_ino: int) -> tuple[View, int]:
        """(view, inode) of a FUSE inode a client's descriptor names (KeyError: unknown)."""
        return self.views.decode(fuse_ino)

    def committed_version(self, view: View, ino: int, gen: int | None = None) -> tuple[FileReader, Attr, int]:
        """A reader on the version an open gets (or the one visible at `gen`), its attributes and
        that generation (in a worker thread). A live inode that a rename or an unlink removed after
        the kernel looked it up (its dentry still names it) opens with the version it had."""
        store = self.store_of(view)
        at = gen if gen is not None else view.gen if view.gen is not None else store.generation
        try:
            attr = store.getattr(ino, at)
        except NotFound:
            if not view.live or gen is not None:
                raise
            at = self._gen_before_removal(ino)
            attr = store.getattr(ino, at)
        return store.open_reader(ino, at), attr, at

    def _gen_before_removal(self, ino: int) -> int:
        """The last generation at which a removed live inode still had a version."""
        versions = self.store.history(ino)  # newest first
        if not versions or versions[0].death_gen is None:
            raise NotFound(f"inode {ino} does not exist")
        return versions[0].death_gen - 1

    @translate_errors
    async def create(self, parent_inode: int, name: bytes, mode: int, flags: int,
                     ctx: pyfuse3.RequestContext) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        parent = self._live(parent_inode)
        while self.handles.auto_snapshot_done is not None:  # see HandleTable.creating
            await self.handles.auto_snapshot_done.wait()
        self.handles.creating += 1
        try:
            # No worker hop: the catalog's writer thread runs the change and wakes this thread.
            # Its commit is not durable: the file's first version (at close, or fsync) makes it
            # durable, or, if nothing is written, Catalog.make_durable(seq) at FLUSH.
            created = self.store.create_submit(parent, name, mode & 0o7777 & ~ctx.umask, ctx.uid, ctx.gid)
            await wait_future(created)
            attr = self.store.catalog.outcome(created)
            seq = self.store.catalog.lazy_seq  # read after the commit: covers it
            session = self.store.open_created_session(attr)
            f = self.handles.open_writer(ViewTable.encode(LIVE_VIEW, attr.ino), attr.ino, session)
            f.attr, f.opener_pid, f.lazy_seq = attr, ctx.pid, seq
        finally:
            self.handles.creating -= 1
        return pyfuse3.FileInfo(fh=f.fh, keep_cache=True), self._known(LIVE_VIEW, attr)

    @translate_errors
    async def read(self, fh: int, off: int, size: int) -> bytes | memoryview:
        f = self.handles.files[fh]
        try:
            if f.reader is not None:
                # A sequential reader's bytes are loaded ahead (store/data/reader.py): served here,
                # or after waiting for their load, with no thread hop.
                data = f.reader.cached(off, size)
                if data is None:
                    loading = f.reader.fetch(off, size)
                    if loading is not None:
                        for future in loading:
                            await wait_future(future)
                        data = f.reader.cached(off, size)
                if data is not None:
                    return data
            return await in_thread(f.read, off, size)
        except CorruptData as e:
            view, _ = self._decode(f.fuse_ino)
            if e.ino is None and f.attr is not None:  # a read through a write session: its base version
                e.ino, e.vid, e.generation = f.attr.ino, f.attr.vid, f.attr.birth_gen
            self.corrupt_log.report(view, f.store_ino, e, f"read at offset {off}")
            raise pyfuse3.FUSEError(errno.EIO) from None

    @translate_errors
    async def write(self, fh: int, off: int, buf: bytes) -> int:
        f = self.handles.files[fh]
        if (shared := f.shared) is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        async with shared.write_order:  # taken before any other await: the arrival order
            if shared.error is not None:  # (a write before this one failed)
                raise pyfuse3.FUSEError(shared.error)
            await _after_put(shared)
            session = shared.session
            while (batch := session.batch_to_wait_for(off, len(buf))) is not None:
                await wait_future(batch)  # this thread serves every file: it never blocks on one file's batch
            try:
                return session.write(off, buf)
            except Exception as e:
                self._session_failed(f, e, "write")
                raise

    def _session_failed(self, f: OpenFile, e: Exception, what: str) -> None:
        """A WRITE or a commit of this session failed (ENOSPC, EIO). With the writeback cache
        the kernel drops the pages of a failed WRITE and reports the error at close, without
        a FLUSH; so from now on nothing of this session is committed: the file keeps its last
        committed version, and FLUSH/fsync/WRITE on any of its handles fail with this error."""
        assert f.shared is not None
        if f.shared.error is not None:
            return
        f.shared.error = e.errno if isinstance(e, (CowfsError, OSError)) and e.errno else errno.EIO
        log.warning("%s of %s failed (%s): %s; it keeps its last committed version",
                    what, self._live_paths(f.store_ino), os.strerror(f.shared.error), e)
        self._forget_cached(f.store_ino)  # unhashed now, the inode goes when its last user closes

    def _live_paths(self, store_ino: int) -> str:
        try:
            return ", ".join(self.store.paths_of(store_ino, self.store.generation)) or f"inode {store_ino}"
        except CowfsError:  # a damaged catalog may not tell
            return f"inode {store_ino}"

    def _forget_cached(self, store_ino: int) -> None:
        """Make the kernel drop its inode of a file whose session failed: with the writeback
        cache it trusts its own size and pages, which are those of writes that were never
        committed. Invalidating every name of it evicts the inode once its last user closes
        it, and the next lookup gets the committed version's attributes."""
        for path in self.store.paths_of(store_ino, self.store.generation):
            head, _, name = path.rpartition("/")
            parent = self.store.resolve(head or "/").ino
            pyfuse3.invalidate_entry_async(ViewTable.encode(LIVE_VIEW, parent), name.encode(errors="surrogateescape"),
                                           ignore_enoent=True)

    async def _commit(self, f: OpenFile, unless_held: bool = False) -> None:
        """Commit the handle's session. `unless_held` (a FLUSH): not if its opener still holds
        the file open for writing (checked in the same worker hop as the commit). After any
        put in progress on the file (a put commits or drops its own bytes whole); a FLUSH
        does not wait for it: a client killed between the parts of its put closes the file
        before its socket, and its exit waits for that FLUSH."""
        if unless_held and f.shared is not None and f.shared.put_lock.locked():
            return
        await _after_put(f.shared)
        if f.shared is None or not f.shared.session.dirty:
            if f.lazy_seq:  # created here and closed with nothing written: the create is durable now
                await in_thread(self.store.catalog.make_durable, f.lazy_seq)
                f.lazy_seq = 0
            return
        if f.shared.error is not None:
            raise pyfuse3.FUSEError(f.shared.error)
        held = None
        if unless_held and self.mount_id is not None and f.opener_pid:
            held = (f.opener_pid, self.mount_id, f.fuse_ino)
        try:
            attr = await in_thread(_commit_unless_held, f.shared.session, held)
        except Exception as e:
            self._session_failed(f, e, "commit")
            raise
        if attr is HELD:
            # the opener still holds the file open: this FLUSH is from a copy of its
            # descriptor (a forked child closing or exec'ing), not the writer's close
            log.debug("flush of inode %d from a descriptor copy: not committing", f.store_ino)
            return
        f.lazy_seq = 0  # a durable commit: it covers the create
        if isinstance(attr, Attr):
            f.attr = attr
            log.debug("committed inode %d: %d bytes at generation %d", f.store_ino, attr.size, attr.birth_gen)

    @translate_errors
    async def flush(self, fh: int) -> None:
        # close() waits for FLUSH, not RELEASE: the new version must be durable here
        await self._commit(self.handles.files[fh], unless_held=True)

    @translate_errors
    async def fsync(self, fh: int, datasync: bool) -> None:
        await self._commit(self.handles.files[fh])

    @translate_errors
    async def release(self, fh: int) -> None:
        f = self.handles.files[fh]
        try:
            if f.shared is None or f.shared.error is None:
                await self._commit(f)  # e.g. pages of a writable mmap written back after close
        finally:
            _, last = self.handles.close(fh)
            if last is not None:
                last.close()  # committed already: this only drops pins, so it is quick and stays
                # on this thread, leaving no moment where the table and the store disagree
                if f.shared is not None and f.shared.error is not None:
                    self._forget_cached(f.store_ino)

    # -- lifecycle ------------------------------------------------------------------------

    async def commit_all(self) -> None:
        """Commit every open write session (unmount, SIGTERM)."""
        for shared in list(self.handles.sessions.values()):
            if shared.put_lock.locked():  # a put's parts so far: never committed without its last
                log.warning("inode %d: a put was in progress at shutdown; it is dropped", shared.session.ino)
                continue
            if shared.session.dirty and shared.error is None:
                try:
                    await in_thread(shared.session.commit)
                except Exception:
                    log.exception("commit of inode %d at shutdown failed", shared.session.ino)
