"""One message of the bulk socket (fs/bulk_server.py): a JSON line with descriptors."""
from __future__ import annotations

import array
import errno
import json
import os
import socket
from typing import Any

import trio

from ..errors import CowfsError

HEADER_MAX = 4096
FDS_MAX = 3  # more than any message sends: a message with too many is refused, not truncated


def _received_fds(ancdata: list[tuple[int, int, bytes]]) -> list[int]:
    fds = array.array("i")
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
    return list(fds)


def close_all(fds: list[int]) -> None:
    """(a worker thread: a descriptor of a file of this mount sends a FLUSH when closed, and
    the trio thread serves it)"""
    for fd in fds:
        if fd >= 0:
            os.close(fd)


async def receive(conn: trio.socket.SocketType, fds: list[int]) -> dict[str, Any] | None:
    """The next message's JSON object, its descriptors appended to `fds` (the caller closes
    them); None if the peer closed the connection."""
    data, ancdata, flags, _ = await conn.recvmsg(HEADER_MAX, socket.CMSG_SPACE(FDS_MAX * array.array("i").itemsize))
    fds.extend(_received_fds(ancdata))
    if not data and not ancdata:
        return None
    if flags & (socket.MSG_CTRUNC | socket.MSG_TRUNC):
        raise CowfsError(f"a message is one JSON line of at most {HEADER_MAX} bytes, with at most 2 descriptors",
                         errno=errno.EINVAL)
    try:
        header = json.loads(data.split(b"\n", 1)[0])
    except ValueError:
        raise CowfsError("malformed request: not a JSON line", errno=errno.EINVAL) from None
    if not isinstance(header, dict):
        raise CowfsError("malformed request: want a JSON object", errno=errno.EINVAL)
    return header
