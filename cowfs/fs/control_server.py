"""The daemon's control socket: CLI requests on a mounted store, served by `cowfs.service`.

Every request runs in a worker thread (they may take long: gc, big reads), so
the FUSE requests keep flowing. After a snapshot is deleted, the kernel's cached
entry for it under .snapshots/ is invalidated.
"""
from __future__ import annotations

import errno
import functools
import json
import logging
import os
import socket
from pathlib import Path
from typing import Any

import pyfuse3
import trio

from .. import service
from ..control import SOCKET_NAME, decode, encode, short_path
from ..errors import CowfsError
from .views import SNAPDIR_INO

log = logging.getLogger("cowfs.control")
MAX_LINE = 1 << 20


async def _handle(stream: trio.SocketStream, ops: Any) -> None:
    buf = b""
    async with stream:
        while True:
            while b"\n" not in buf:
                data = await stream.receive_some(65536)
                if not data:
                    return
                buf += data
                if len(buf) > MAX_LINE:
                    return
            line, buf = buf.split(b"\n", 1)
            reply = await _dispatch(line, ops)
            await stream.send_all(json.dumps(reply).encode() + b"\n")


async def _dispatch(line: bytes, ops: Any) -> dict[str, Any]:
    try:
        req = json.loads(line)
        fn = service.OPS[req["op"]]
        args = {k: decode(v) for k, v in req.get("args", {}).items()}
    except (ValueError, KeyError, TypeError):
        return {"ok": False, "error": "malformed request", "errno": errno.EINVAL}
    try:
        result = await trio.to_thread.run_sync(functools.partial(fn, ops.store, **args))
    except CowfsError as e:
        return {"ok": False, "error": str(e), "errno": e.errno}
    except TypeError as e:
        return {"ok": False, "error": f"bad arguments for {req['op']}: {e}", "errno": errno.EINVAL}
    except Exception as e:  # noqa: BLE001 - reported to the client and logged, never kills the daemon
        log.exception("control request %s failed", req.get("op"))
        return {"ok": False, "error": f"{req['op']} failed: {e}", "errno": errno.EIO}
    if req["op"] == "restore":  # the live file changed under the kernel's caches
        try:
            await trio.to_thread.run_sync(pyfuse3.invalidate_inode, result["ino"])
        except Exception:  # noqa: BLE001 - not cached: nothing to drop
            pass
    gone: list[str] = []
    if req["op"] == "snapshot_delete":
        gone = list(args.get("names", []))
    elif req["op"] == "prune" and not result["dry_run"]:
        gone = [s["name"] for s in result["snapshots"] if not s["keep"]]
    for name in gone:  # the kernel may still hold .snapshots/NAME in its dentry cache
        pyfuse3.invalidate_entry_async(SNAPDIR_INO, name.encode())
    return {"ok": True, "result": encode(result)}


async def serve_control(ops: Any, store_root: Path, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    dir_fd = os.open(store_root, os.O_PATH | os.O_DIRECTORY)
    path = short_path(dir_fd, SOCKET_NAME)
    try:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        await sock.bind(path)
        os.chmod(path, 0o600)
        sock.listen(16)
        listener = trio.SocketListener(sock)
        task_status.started()
        try:
            await trio.serve_listeners(functools.partial(_handle, ops=ops), [listener])
        finally:
            try:
                os.unlink(path)
            except OSError:
                pass
    finally:
        os.close(dir_fd)
