"""A put (fs/bulk_server.py): a file's new bytes handed over in memfds and committed as its new
version without FUSE requests (issue 34; docs/design.md section 18).

A client (`cowfs.plugins.put`) opens the file through the mount for writing, so the kernel
has made every check an open makes (permissions, a read-only snapshot: EROFS), and names
that descriptor in its request (bulk_target.py). The bytes come in parts, each a memfd,
sent as soon as it is full: the file's write session (the one the client's open made)
takes each part as it comes, so the daemon cuts, hashes and writes one part while the
client makes the next. A part sealed against writes and shrinking is taken as read-only
views of a read-only mapping, passed to the native batches without a copy in Python. A
part without those seals (a client keeps its memfds for its next put, and a seal cannot be
taken off) is copied first, 1 MiB at a time (`pread`, as a FUSE WRITE's bytes are), so the
bytes the daemon hashes are the bytes it stores whatever the client does meanwhile.
After the last part it commits: durable when the reply goes out. Versions, dedup,
snapshots and uploads follow from that commit as from a save through the mount. While a
put runs, the session's `put_lock` is held: a FLUSH does not commit (the put commits its
bytes whole, or drops them), and fsync, RELEASE, WRITE and truncation wait for it. A
failure, or a client gone before its last part, aborts the session's uncommitted changes:
the file keeps its last committed version.
"""
from __future__ import annotations

import errno
import fcntl
import mmap
import os
import stat
from typing import TYPE_CHECKING, Any

import pyfuse3
import trio

from .. import _native
from ..errors import CowfsError
from .bulk_messages import receive
from .bulk_target import target_file

if TYPE_CHECKING:
    from ..store.catalog.namespace import Attr
    from ..store.data.session import WriteSession
    from .operations import CowfsOperations

PUT_PIECE = 1 << 20  # bytes per session write: the pieces a batch is cut over, as FUSE WRITEs are
SEALS_NEEDED = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_WRITE


class _PartsWriter:
    """(worker threads, one call at a time) Parts of the new bytes, each a memfd, written in
    order into the session: a sealed part as read-only views of its mapping (no copy in
    Python: the native batches cut, hash and stage straight from the pages), an unsealed
    one as copies. The mappings stay until `close`, after the commit or abort: the session
    may hold views of them till then."""

    def __init__(self, session: "WriteSession") -> None:
        self.session = session
        self.size = 0
        self._mappings: list[mmap.mmap] = []
        self._views: list[memoryview] = []
        session.truncate(0)

    def write(self, memfd: int, size: int, sealed: bool) -> None:
        if not size:
            return
        if not sealed:
            self._copy(memfd, size)
            return
        # the pages mapped in one go, not faulted in one by one by the gear loop; by
        # populate, which releases the GIL (mmap.mmap with MAP_POPULATE holds it)
        mapping = mmap.mmap(memfd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
        self._mappings.append(mapping)
        view = memoryview(mapping)
        self._views.append(view)
        _native.populate(view)
        for off in range(0, size, PUT_PIECE):
            self.session.write(self.size + off, view[off:off + PUT_PIECE], borrow=True)
        self.size += size

    def _copy(self, memfd: int, size: int) -> None:
        for off in range(0, size, PUT_PIECE):
            want = min(PUT_PIECE, size - off)
            piece = os.pread(memfd, want, off)  # (the GIL released; never a SIGBUS, unlike a mapping)
            if len(piece) != want:
                raise CowfsError(f"the memfd shrank to {off + len(piece)} bytes while the daemon read its {size}: "
                                 f"nothing committed", errno=errno.EINVAL)
            self.session.write(self.size + off, piece)
        self.size += size

    def commit(self) -> "Attr":
        attr = self.session.commit()
        if attr is None:
            raise CowfsError("the file was removed while its bytes were being put", errno=errno.ENOENT)
        return attr

    def close(self) -> None:
        for view in self._views:
            view.release()
        for mapping in self._mappings:
            try:
                mapping.close()
            except BufferError:  # a view still held somewhere: the mapping goes with it
                pass
        self._views, self._mappings = [], []


def _sealed(memfd: int, size: int) -> bool:
    """Whether the part's memfd is sealed against writes and shrinking (read in place) or not
    (copied); EINVAL if it is no memfd or holds fewer than `size` bytes."""
    if not os.readlink(f"/proc/self/fd/{memfd}").startswith("/memfd:"):  # (no request to any file system)
        raise CowfsError("the bytes must come in a memfd", errno=errno.EINVAL)
    mst = os.fstat(memfd)
    if not stat.S_ISREG(mst.st_mode) or mst.st_size < size:
        raise CowfsError(f"the memfd holds {mst.st_size} bytes, the put says {size}", errno=errno.EINVAL)
    seals = fcntl.fcntl(memfd, fcntl.F_GET_SEALS)  # (a memfd made without MFD_ALLOW_SEALING: F_SEAL_SEAL)
    return seals & SEALS_NEEDED == SEALS_NEEDED


def _part_size(header: dict[str, Any]) -> int:
    size = header.get("size")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise CowfsError('malformed put: want {"op": "put", "size": N}, then {"size": N, "more": ...} per part',
                         errno=errno.EINVAL)
    return size


async def _parts(conn: trio.socket.SocketType, header: dict[str, Any], memfd: int, fds: list[int],
                 writer: _PartsWriter) -> None:
    """Write the first part (`memfd`) and every part after it while the header says more come."""
    while True:
        size = _part_size(header)
        await trio.to_thread.run_sync(writer.write, memfd, size, _sealed(memfd, size))
        if not header.get("more"):
            return
        part_fds: list[int] = []
        try:
            nxt = await receive(conn, part_fds)
        finally:
            fds.extend(part_fds)  # (closed with the rest, by the server)
        if nxt is None:
            raise CowfsError("the client went away before its last part: nothing committed", errno=errno.EPIPE)
        if len(part_fds) != 1:
            raise CowfsError(f"a part sends 1 descriptor (a memfd), not {len(part_fds)}", errno=errno.EINVAL)
        header, memfd = nxt, part_fds[0]


async def put(ops: "CowfsOperations", header: dict[str, Any], fds: list[int],
              conn: trio.socket.SocketType) -> tuple[dict[str, Any], list[int]]:
    """{"op": "put", "fd": F, "size": N} with [memfd] (F: the client's descriptor of the file,
    open for writing through the mount): the memfd's bytes committed as the file's new
    version. With "more": true, further parts follow on the connection, {"size": N,
    "more": ...} with [memfd] each, until one says no more: the session takes each part as it
    comes, so the bytes are cut, hashed and written while the client still makes the next;
    the commit follows the last. The reply's result is the version's size and id."""
    _part_size(header)
    if len(fds) != 1:
        raise CowfsError(f"a put sends 1 descriptor (a memfd), not {len(fds)}, and names the file open for "
                         f"writing through the mount by its number: {{\"fd\": N}}", errno=errno.EINVAL)
    memfd = fds[0]
    _view, ino, fuse_ino = await target_file(ops, conn, header, writing=True)
    shared = ops.handles.sessions.get(ino)
    if shared is None:
        raise CowfsError("the file has no open write session", errno=errno.EBADF)
    if shared.error is not None:
        raise CowfsError("an earlier write to this file failed; close it and open it again", errno=shared.error)
    # two puts to one file run one after the other; FLUSH, fsync, RELEASE and WRITE wait too
    async with shared.put_lock:
        writer: _PartsWriter | None = None
        try:
            writer = await trio.to_thread.run_sync(_PartsWriter, shared.session)
            await _parts(conn, header, memfd, fds, writer)
            attr = await trio.to_thread.run_sync(writer.commit)
        except BaseException:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(shared.session.abort)
            raise
        finally:
            if writer is not None:
                writer.close()
    for fh in shared.handles:
        f = ops.handles.files[fh]
        f.attr, f.lazy_seq = attr, 0  # a durable commit: it covers the file's create too
    try:  # the kernel's cached pages and size of the file are those of the version before
        await trio.to_thread.run_sync(pyfuse3.invalidate_inode, fuse_ino)
    except OSError:
        pass
    return {"size": attr.size, "vid": attr.vid}, []
