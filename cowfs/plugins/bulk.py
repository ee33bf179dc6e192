"""The client's side of a cowfs mount's bulk socket (fs/bulk_server.py): one request, with
descriptors, and its reply (with descriptors) on a fresh connection.

The socket's peer must be the user that mounted the file's cowfs mount (SO_PEERCRED against
the mount's user_id): a process that took the socket's name first gets nothing.
"""
from __future__ import annotations

import array
import errno
import json
import os
import socket
import struct
from typing import Any

from ..mountinfo import cowfs_mount_owner
from ..protocol import bulk_socket_name

REPLY_MAX = 1 << 16
FDS_MAX = 2


class BulkRefused(OSError):
    """The daemon refused or failed the request; nothing changed."""


def _same_pid_namespace(pid: int) -> bool:
    """Whether process `pid` (as this process sees it) is in this process's pid namespace: its
    NSpid line (world-readable) then holds one pid, not one per nested namespace."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"NSpid:"):
                    return len(line.split()) == 2
    except OSError:
        pass
    return False


def release_fd(fd: int) -> None:
    """Close a descriptor of a file on the mount. Its close error is not raised: ENOTCONN once
    the daemon is gone, or an error of the FLUSH, says nothing of a get or a put (the daemon's
    reply does), and Linux has released the descriptor even when close fails, so a caller that
    raised here and closed it again later would close whatever file got that number since
    (a background save's PutStream did, when its daemon was killed)."""
    try:
        os.close(fd)
    except OSError:
        pass


def daemon_socket(fd: int) -> socket.socket | None:
    """A connection to the bulk socket of the cowfs mount holding `fd`, or None: not cowfs, no
    bulk socket, or a daemon that could not read this process's descriptors in /proc (another
    pid namespace, or another user than root or ours), so the bytes go through the mount."""
    dev = os.fstat(fd).st_dev
    owner = cowfs_mount_owner(dev)
    if owner is None:
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.connect(bulk_socket_name(dev))
        pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        if uid != owner:
            raise BulkRefused(errno.EACCES, f"the bulk socket of this mount belongs to uid {uid}, not to the mount's "
                              f"owner {owner}")
        if pid <= 0 or not _same_pid_namespace(pid) or uid not in (0, os.geteuid()):
            sock.close()
            return None
    except (ConnectionRefusedError, FileNotFoundError):
        sock.close()
        return None
    except BaseException:
        sock.close()
        raise
    return sock


def send(sock: socket.socket, header: dict[str, Any], fds: list[int]) -> None:
    """One message: a JSON line with descriptors."""
    socket.send_fds(sock, [json.dumps(header).encode() + b"\n"], fds)


def receive_reply(sock: socket.socket, what: str) -> tuple[dict[str, Any], list[int]]:
    """The reply's result and the descriptors that came with it (the caller closes them);
    raise BulkRefused naming `what` if the daemon refused."""
    buf = b""
    got: list[int] = []
    try:
        while b"\n" not in buf:
            data, ancdata, _flags, _ = sock.recvmsg(REPLY_MAX, socket.CMSG_SPACE(FDS_MAX * array.array("i").itemsize))
            for level, kind, raw in ancdata:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    got.extend(array.array("i", raw[:len(raw) - len(raw) % 4]))
            if not data:
                raise BulkRefused(errno.EIO, f"{what}: the cowfs daemon closed its bulk socket without a reply")
            buf += data
        reply = json.loads(buf.split(b"\n", 1)[0])
        if not isinstance(reply, dict):
            raise BulkRefused(errno.EIO, f"{what}: malformed reply from the cowfs daemon")
        if not reply.get("ok"):
            raise BulkRefused(reply.get("errno") or errno.EIO, f"{what}: {reply.get('error', 'request failed')}")
        return reply.get("result") or {}, got
    except BaseException:
        for fd in got:
            os.close(fd)
        raise


def request(sock: socket.socket, header: dict[str, Any], fds: list[int], what: str) -> tuple[dict[str, Any], list[int]]:
    """Send one request and return its reply (receive_reply)."""
    send(sock, header, fds)
    return receive_reply(sock, what)
