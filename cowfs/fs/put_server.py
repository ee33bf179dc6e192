"""The put socket: a file's new bytes handed over in a sealed memfd and committed as its new
version without FUSE requests (issue 34; docs/design.md section 15, "Puts").

A client (`cowfs.plugins.put`) opens the file through the mount for writing, so the kernel
has made every check an open makes (permissions, a read-only snapshot: EROFS), writes the
bytes into a memfd and seals it against writes and shrinking, and sends both descriptors in
one message on the abstract unix socket named after the mount's device
(`protocol.put_socket_name`). Here the first must be a regular file of this mount, open for
writing; its write session (the one the client's open made) takes the memfd's pages as one
stream, read-only views of a read-only mapping passed to the native batches without a copy
in Python, and commits: durable when the reply goes out. Versions, dedup, snapshots and
uploads follow from that commit as from a save through the mount. A failure aborts the
session's uncommitted changes: the file keeps its last committed version.
"""
from __future__ import annotations

import array
import errno
import fcntl
import json
import logging
import mmap
import os
import socket
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyfuse3
import trio

from ..errors import CowfsError
from ..mountinfo import mount_device
from ..protocol import put_socket_name

if TYPE_CHECKING:
    from ..store.catalog.namespace import Attr
    from ..store.data.session import WriteSession
    from .operations import CowfsOperations

log = logging.getLogger("cowfs.put")
HEADER_MAX = 4096
PUT_PIECE = 1 << 20  # bytes per session write: the pieces a batch is cut over, as FUSE WRITEs are
SEALS_NEEDED = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_WRITE


_put_locks: dict[int, trio.Lock] = {}  # store inode -> the lock of the puts to it (trio thread only)


class PutError(Exception):
    def __init__(self, errno_: int, message: str) -> None:
        super().__init__(message)
        self.errno = errno_


def _received_fds(ancdata: list[tuple[int, int, bytes]]) -> list[int]:
    fds = array.array("i")
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
    return list(fds)


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


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
        raise PutError(errno.ENOENT, "the file was removed while its bytes were being put")
    return attr


async def _put(ops: "CowfsOperations", dev: int, header: Any, fds: list[int]) -> dict[str, Any]:
    if not isinstance(header, dict) or header.get("op") != "put" or not isinstance(header.get("size"), int) \
            or header["size"] < 0:
        raise PutError(errno.EINVAL, 'malformed put: want {"op": "put", "size": N}')
    if len(fds) != 2:
        raise PutError(errno.EINVAL, f"a put sends 2 descriptors (the file open for writing through the mount, "
                       f"then a sealed memfd), not {len(fds)}")
    target, memfd = fds
    # a worker thread: a stat of a file of this mount may ask this very thread for its attributes
    st = await trio.to_thread.run_sync(os.fstat, target)
    if st.st_dev != dev or not stat.S_ISREG(st.st_mode):
        raise PutError(errno.EXDEV, "the file descriptor is not a regular file of this cowfs mount")
    if fcntl.fcntl(target, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY:
        raise PutError(errno.EBADF, "the file is not open for writing")
    try:
        view, ino = ops.views.decode(st.st_ino)
    except KeyError:
        raise PutError(errno.ENOENT, "the file is no longer known to the mount") from None
    if not view.live:
        raise PutError(errno.EROFS, "a snapshot is read-only")
    shared = ops.handles.sessions.get(ino)
    if shared is None:
        raise PutError(errno.EBADF, "the file has no open write session")
    if shared.error is not None:
        raise PutError(shared.error, "an earlier write to this file failed; close it and open it again")
    size = header["size"]
    mst = await trio.to_thread.run_sync(os.fstat, memfd)  # (whatever the peer sent: maybe a file of this mount)
    if not stat.S_ISREG(mst.st_mode) or mst.st_size != size:
        raise PutError(errno.EINVAL, f"the memfd holds {mst.st_size} bytes, the put says {size}")
    try:
        seals = fcntl.fcntl(memfd, fcntl.F_GET_SEALS)
    except OSError:
        raise PutError(errno.EINVAL, "the bytes must come in a memfd made with MFD_ALLOW_SEALING") from None
    if seals & SEALS_NEEDED != SEALS_NEEDED:
        raise PutError(errno.EPERM, "seal the memfd against shrinking and writes (F_SEAL_SHRINK, F_SEAL_WRITE) "
                       "before sending it")
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
    return {"size": attr.size, "vid": attr.vid}


async def _serve_one(ops: "CowfsOperations", dev: int, conn: trio.socket.SocketType) -> None:
    fds: list[int] = []
    with conn:
        try:
            data, ancdata, flags, _ = await conn.recvmsg(HEADER_MAX, socket.CMSG_SPACE(3 * array.array("i").itemsize))
            fds = _received_fds(ancdata)
            if flags & (socket.MSG_CTRUNC | socket.MSG_TRUNC):
                raise PutError(errno.EINVAL, "a put's header is one JSON line of at most 4096 bytes, with 2 descriptors")
            try:
                header = json.loads(data.split(b"\n", 1)[0])
            except ValueError:
                raise PutError(errno.EINVAL, "malformed put: not a JSON line") from None
            reply: dict[str, Any] = {"ok": True, "result": await _put(ops, dev, header, fds)}
        except PutError as e:
            reply = {"ok": False, "error": str(e), "errno": e.errno}
        except CowfsError as e:
            reply = {"ok": False, "error": str(e), "errno": e.errno}
        except OSError as e:
            reply = {"ok": False, "error": e.strerror or str(e), "errno": e.errno or errno.EIO}
        except Exception as e:  # noqa: BLE001 - reported to the client and logged, never kills the daemon
            log.exception("put failed")
            reply = {"ok": False, "error": f"put failed: {e}", "errno": errno.EIO}
        finally:
            # a worker thread: closing a descriptor of a file of this mount sends a FLUSH, which
            # this very thread serves (the commit is done: that FLUSH finds nothing to commit)
            await trio.to_thread.run_sync(_close_all, fds)
        out = json.dumps(reply).encode() + b"\n"
        try:
            while out:
                out = out[await conn.send(out):]
        except OSError:
            pass  # the client went away: its put is committed or not, as the reply would have said


async def serve_put(ops: "CowfsOperations", mountpoint: Path, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """Take puts on the mount's abstract socket until cancelled. A mount whose socket cannot
    be bound (the name taken) serves without puts: clients then write through FUSE."""
    dev = mount_device(os.path.abspath(mountpoint))  # (no resolve(): a stat of the mount would wait for this thread)
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        if dev is None:
            raise OSError(errno.ENOENT, f"{mountpoint} is not in /proc/self/mountinfo")
        await sock.bind(put_socket_name(dev))
        sock.listen(64)
    except OSError as e:
        log.warning("no put socket for %s (%s): puts go through FUSE", mountpoint, e)
        sock.close()
        task_status.started()
        return
    task_status.started()
    with sock:
        async with trio.open_nursery() as nursery:
            while True:
                conn, _ = await sock.accept()
                nursery.start_soon(_serve_one, ops, dev, conn)
