"""A put (fs/bulk_server.py): a file's new bytes handed over in a sealed memfd and committed
as its new version without FUSE requests (issue 34; docs/design.md section 18).

A client (`cowfs.plugins.put`) opens the file through the mount for writing, so the kernel
has made every check an open makes (permissions, a read-only snapshot: EROFS), writes the
bytes into a memfd and seals it against writes and shrinking, and sends both descriptors.
The file's write session (the one the client's open made) takes the memfd's pages as one
stream, read-only views of a read-only mapping passed to the native batches without a copy
in Python, and commits: durable when the reply goes out. Versions, dedup, snapshots and
uploads follow from that commit as from a save through the mount. A failure aborts the
session's uncommitted changes: the file keeps its last committed version.
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

from ..errors import CowfsError
from .bulk_target import target_file

if TYPE_CHECKING:
    from ..store.catalog.namespace import Attr
    from ..store.data.session import WriteSession
    from .operations import CowfsOperations

PUT_PIECE = 1 << 20  # bytes per session write: the pieces a batch is cut over, as FUSE WRITEs are
SEALS_NEEDED = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_WRITE

_put_locks: dict[int, trio.Lock] = {}  # store inode -> the lock of the puts to it (trio thread only)


def _commit_bytes(session: "WriteSession", memfd: int, size: int) -> "Attr":
    """(worker thread) The memfd's bytes as the session's whole view, committed."""
    # MAP_POPULATE: the pages mapped in one go, not faulted in one by one by the gear loop
    mapping = mmap.mmap(memfd, size, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE, prot=mmap.PROT_READ) if size else None
    view = memoryview(mapping) if mapping is not None else memoryview(b"")
    try:
        session.truncate(0)
        for off in range(0, size, PUT_PIECE):
            session.write(off, view[off:off + PUT_PIECE], borrow=True)
        attr = session.commit()
    except BaseException:
        session.abort()
        raise
    finally:
        view.release()
        if mapping is not None:
            try:
                mapping.close()
            except BufferError:  # a view still held somewhere: the mapping goes with it
                pass
    if attr is None:
        raise CowfsError("the file was removed while its bytes were being put", errno=errno.ENOENT)
    return attr


async def _sealed_size(memfd: int, size: int) -> None:
    mst = await trio.to_thread.run_sync(os.fstat, memfd)  # (whatever the peer sent: maybe a file of this mount)
    if not stat.S_ISREG(mst.st_mode) or mst.st_size != size:
        raise CowfsError(f"the memfd holds {mst.st_size} bytes, the put says {size}", errno=errno.EINVAL)
    try:
        seals = fcntl.fcntl(memfd, fcntl.F_GET_SEALS)
    except OSError:
        raise CowfsError("the bytes must come in a memfd made with MFD_ALLOW_SEALING", errno=errno.EINVAL) from None
    if seals & SEALS_NEEDED != SEALS_NEEDED:
        raise CowfsError("seal the memfd against shrinking and writes (F_SEAL_SHRINK, F_SEAL_WRITE) before sending it",
                         errno=errno.EPERM)


async def put(ops: "CowfsOperations", dev: int, header: dict[str, Any], fds: list[int]) -> tuple[dict[str, Any], list[int]]:
    """{"op": "put", "size": N} with [file, memfd]: the memfd's bytes committed as the file's
    new version; the reply's result is its size and version id."""
    size = header.get("size")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise CowfsError('malformed put: want {"op": "put", "size": N}', errno=errno.EINVAL)
    if len(fds) != 2:
        raise CowfsError(f"a put sends 2 descriptors (the file open for writing through the mount, then a sealed "
                         f"memfd), not {len(fds)}", errno=errno.EINVAL)
    target, memfd = fds
    st, _view, ino = await target_file(ops, dev, target, writing=True)
    shared = ops.handles.sessions.get(ino)
    if shared is None:
        raise CowfsError("the file has no open write session", errno=errno.EBADF)
    if shared.error is not None:
        raise CowfsError("an earlier write to this file failed; close it and open it again", errno=shared.error)
    await _sealed_size(memfd, size)
    lock = _put_locks.setdefault(ino, trio.Lock())  # two puts to one file: one after the other
    try:
        async with lock:
            attr = await trio.to_thread.run_sync(_commit_bytes, shared.session, memfd, size)
    finally:
        if not lock.locked() and not lock.statistics().tasks_waiting:
            _put_locks.pop(ino, None)
    for fh in shared.handles:
        f = ops.handles.files[fh]
        f.attr, f.lazy_seq = attr, 0  # a durable commit: it covers the file's create too
    try:  # the kernel's cached pages and size of the file are those of the version before
        await trio.to_thread.run_sync(pyfuse3.invalidate_inode, st.st_ino)
    except OSError:
        pass
    return {"size": attr.size, "vid": attr.vid}, []
