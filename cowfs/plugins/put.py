"""`put(path, fill)`: a file's new bytes to a cowfs mount's daemon in a sealed memfd, committed
durably as one new version, without FUSE requests for the bytes (fs/put_server.py).

The file is opened for writing through the mount first (O_CREAT, without O_TRUNC), so the
kernel checks permissions and refuses snapshots as for any open; the descriptor is the
proof the daemon asks for. Its bytes go into a memfd, which is sealed and sent with it. The
daemon's reply comes once the new version is durable; closing the descriptor then commits
nothing more. Where the path is not on a cowfs mount, or its daemon takes no puts, the bytes
are written through the descriptor and fsynced: the same result the slow way.

The socket's peer must be the user that mounted the file's cowfs mount (SO_PEERCRED against
the mount's user_id): a process that took the socket's name first gets nothing.
"""
from __future__ import annotations

import errno
import fcntl
import io
import json
import os
import socket
import struct
from typing import BinaryIO, Callable

from ..mountinfo import cowfs_mount_owner
from ..protocol import put_socket_name

SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
REPLY_MAX = 1 << 16


class PutRefused(OSError):
    """The daemon refused or failed the put; nothing changed."""


def _daemon_socket(fd: int) -> socket.socket | None:
    """A connection to the put socket of the cowfs mount holding `fd`, or None (not cowfs, or
    no put socket)."""
    dev = os.fstat(fd).st_dev
    owner = cowfs_mount_owner(dev)
    if owner is None:
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.connect(put_socket_name(dev))
        _pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        if uid != owner:
            raise PutRefused(errno.EACCES, f"the put socket of this mount belongs to uid {uid}, not to the mount's "
                             f"owner {owner}")
    except (ConnectionRefusedError, FileNotFoundError):
        sock.close()
        return None
    except BaseException:
        sock.close()
        raise
    return sock


def _write_plain(fd: int, fill: Callable[[BinaryIO], None]) -> None:
    os.ftruncate(fd, 0)
    with io.FileIO(fd, "wb", closefd=False) as raw, io.BufferedWriter(raw, 1 << 20) as f:
        fill(f)
    os.fsync(fd)


def put(path: str | os.PathLike, fill: Callable[[BinaryIO], None], mode: int = 0o666) -> bool:
    """Make `path`'s content what `fill` writes into the file object it is given, durably and
    as one new version. True when a cowfs daemon took the bytes, False when they were written
    through the file (not a cowfs mount). Raises OSError (PutRefused from the daemon) and
    leaves the file as it was when anything fails."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, mode)
    try:
        sock = _daemon_socket(fd)
        if sock is None:
            _write_plain(fd, fill)
            return False
        with sock:
            memfd = os.memfd_create("cowfs-put", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
            try:
                with io.FileIO(memfd, "wb", closefd=False) as raw, io.BufferedWriter(raw, 1 << 20) as f:
                    fill(f)
                size = os.fstat(memfd).st_size
                fcntl.fcntl(memfd, fcntl.F_ADD_SEALS, SEALS)
                socket.send_fds(sock, [json.dumps({"op": "put", "size": size}).encode() + b"\n"], [fd, memfd])
            finally:
                os.close(memfd)
            reply = _read_reply(sock)
        if not reply.get("ok"):
            code = reply.get("errno") or errno.EIO
            raise PutRefused(code, f"{os.fspath(path)}: {reply.get('error', 'put failed')}")
        return True
    finally:
        os.close(fd)


def _read_reply(sock: socket.socket) -> dict:
    buf = b""
    while b"\n" not in buf:
        data = sock.recv(REPLY_MAX)
        if not data:
            raise PutRefused(errno.EIO, "the cowfs daemon closed the put socket without a reply "
                             "(the file keeps its last committed version unless a reply said otherwise)")
        buf += data
    reply = json.loads(buf.split(b"\n", 1)[0])
    if not isinstance(reply, dict):
        raise PutRefused(errno.EIO, "malformed reply from the cowfs daemon")
    return reply
