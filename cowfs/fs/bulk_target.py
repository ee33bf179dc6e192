"""The file a bulk request is about (fs/bulk_server.py): a descriptor the client opened through
this mount, named by its number and checked in the client's /proc/PID/fdinfo.

The client opened the file through the mount, so the kernel made the open's checks
(permissions; EROFS for a snapshot opened for writing): its open descriptor is the proof.
The daemon never takes that descriptor itself. A daemon holding a descriptor of a file of
its own mount would hang if killed: its exit closes the descriptor, and the FLUSH of that
close waits, uninterruptibly, for an answer from this very daemon. So the descriptor is
named by number and looked up in the peer's fdinfo (SO_PEERCRED gives the peer's pid): its
flags, mount id and inode, read without a request to any file system.
"""
from __future__ import annotations

import errno
import os
import socket
import struct
from typing import TYPE_CHECKING, Any

import trio

from ..errors import CowfsError, NotFound
from .openers import fd_info

if TYPE_CHECKING:
    from .operations import CowfsOperations
    from .views import View


def peer_pid(conn: trio.socket.SocketType) -> int:
    pid, _uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    return pid


async def target_file(ops: "CowfsOperations", conn: trio.socket.SocketType, header: dict[str, Any],
                      writing: bool) -> tuple["View", int, int]:
    """(view, store inode, FUSE inode) of the client's descriptor `header["fd"]`, which must be
    a regular file of this mount opened for writing (`writing`) or for reading."""
    fd = header.get("fd")
    if not isinstance(fd, int) or isinstance(fd, bool) or fd < 0:
        raise CowfsError('a request names the file by its descriptor in the client: {"fd": N}', errno=errno.EINVAL)
    pid = peer_pid(conn)
    info = fd_info(pid, fd) if pid > 0 else None
    if info is None:
        raise CowfsError(f"descriptor {fd} of the client (pid {pid}) cannot be read from /proc: not open, or "
                         f"another pid namespace or user; read and write through the mount", errno=errno.EBADF)
    flags, mnt_id, fuse_ino = info
    if ops.mount_id is None or mnt_id != ops.mount_id:
        raise CowfsError("the file descriptor is not a file of this cowfs mount", errno=errno.EXDEV)
    mode = flags & os.O_ACCMODE
    if writing and mode == os.O_RDONLY:
        raise CowfsError("the file is not open for writing", errno=errno.EBADF)
    if not writing and mode == os.O_WRONLY:
        raise CowfsError("the file is not open for reading", errno=errno.EBADF)
    try:
        view, ino = ops.file_of(fuse_ino)
    except KeyError:
        raise CowfsError("the file is no longer known to the mount", errno=errno.ENOENT) from None
    if writing and not view.live:
        raise CowfsError("a snapshot, or another node's file, is read-only", errno=errno.EROFS)
    try:
        attr = await trio.to_thread.run_sync(ops.store_of(view).getattr, ino, view.gen)
    except NotFound:
        if writing:
            raise
        return view, ino, fuse_ino  # removed while open: a read still gets the version it had
    if not attr.is_file:
        raise CowfsError("the file descriptor is not a regular file of this cowfs mount", errno=errno.EXDEV)
    return view, ino, fuse_ino
