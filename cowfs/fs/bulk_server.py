"""The bulk socket: files' bytes in memfds, beside FUSE (issue 34; docs/design.md section 18).

An abstract unix socket named after the mount's device (`protocol.bulk_socket_name`) takes
one request per connection: a JSON line with descriptors (SCM_RIGHTS), naming the file by
the number of the client's descriptor of it, opened through this mount (the kernel's open
checks are the permission checks; bulk_target.py reads it from the client's fdinfo). A put (put_op.py) commits the bytes of its memfds as the file's new version; a get
(get_op.py) answers with a sealed memfd of the file's bytes. Every failure is one JSON reply
{"ok": false, "error", "errno"} and changes nothing.
"""
from __future__ import annotations

import array
import errno
import json
import logging
import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any, Awaitable, Callable

import trio

from ..errors import CowfsError
from ..mountinfo import mount_device
from ..protocol import bulk_socket_name
from .bulk_messages import close_all, receive
from .get_op import get
from .put_op import put

if TYPE_CHECKING:
    from .operations import CowfsOperations

log = logging.getLogger("cowfs.bulk")

# op(ops, header, descriptors, connection) -> (result, descriptors to send back)
Op = Callable[["CowfsOperations", dict[str, Any], list[int], trio.socket.SocketType],
              Awaitable[tuple[dict[str, Any], list[int]]]]
OPS: dict[str, Op] = {"put": put, "get": get}


async def _answer(ops: "CowfsOperations", conn: trio.socket.SocketType,
                  fds: list[int]) -> tuple[dict[str, Any], list[int]]:
    header = await receive(conn, fds)
    if header is None:
        raise CowfsError("no request", errno=errno.EINVAL)
    name = header.get("op")
    op = OPS.get(name) if isinstance(name, str) else None
    if op is None:
        raise CowfsError(f"malformed request: want a JSON object whose op is one of {sorted(OPS)}", errno=errno.EINVAL)
    result, out_fds = await op(ops, header, fds, conn)
    return {"ok": True, "result": result}, out_fds


async def _serve_one(ops: "CowfsOperations", conn: trio.socket.SocketType) -> None:
    fds: list[int] = []
    out_fds: list[int] = []
    with conn:
        try:
            reply, out_fds = await _answer(ops, conn, fds)
        except CowfsError as e:
            reply = {"ok": False, "error": str(e), "errno": e.errno}
        except OSError as e:
            reply = {"ok": False, "error": e.strerror or str(e), "errno": e.errno or errno.EIO}
        except Exception as e:  # noqa: BLE001 - reported to the client and logged, never kills the daemon
            log.exception("bulk request failed")
            reply = {"ok": False, "error": f"request failed: {e}", "errno": errno.EIO}
        finally:
            # memfds; but a bad client may send a descriptor of a file of this mount where a memfd
            # belongs, and its close sends a FLUSH that this very thread serves: a worker thread
            await trio.to_thread.run_sync(close_all, fds)
        out = json.dumps(reply).encode() + b"\n"
        try:
            if out_fds:
                out = out[await conn.sendmsg([out], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                                      array.array("i", out_fds).tobytes())]):]
            while out:
                out = out[await conn.send(out):]
        except OSError:
            pass  # the client went away: a put is committed or not, as the reply would have said
        finally:
            close_all(out_fds)  # (memfds: no FUSE request)


async def serve_bulk(ops: "CowfsOperations", mountpoint: Path, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """Serve the bulk socket until cancelled. A mount whose socket cannot be bound (the name
    taken) serves without it: clients then read and write through FUSE."""
    dev = mount_device(os.path.abspath(mountpoint))  # (no resolve(): a stat of the mount would wait for this thread)
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        if dev is None:
            raise OSError(errno.ENOENT, f"{mountpoint} is not in /proc/self/mountinfo")
        await sock.bind(bulk_socket_name(dev))
        sock.listen(64)
    except OSError as e:
        log.warning("no bulk socket for %s (%s): files' bytes go through FUSE only", mountpoint, e)
        sock.close()
        task_status.started()
        return
    task_status.started()
    with sock:
        async with trio.open_nursery() as nursery:
            while True:
                conn, _ = await sock.accept()
                nursery.start_soon(_serve_one, ops, conn)
