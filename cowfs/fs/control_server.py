"""The daemon's control socket: CLI requests on a mounted store, served by `cowfs.service`.

Every request runs in a worker thread (they may take long: gc, big reads), so
the FUSE requests keep flowing; gc, fsck and prune may stream progress lines
before their reply. A `watch` request turns its connection into a stream of
change events pushed by the store. After a snapshot is deleted, the kernel's
cached entry for it under .snapshots/ is invalidated.
"""
from __future__ import annotations

import errno
import functools
import json
import logging
import math
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pyfuse3
import trio

from .. import service
from ..errors import CowfsError
from ..protocol import SOCKET_NAME, decode, encode, short_path
from ..store.catalog.events import Event
from .views import SNAPDIR_INO

log = logging.getLogger("cowfs.control")
MAX_LINE = 1 << 20
PROGRESS_INTERVAL = 0.1  # seconds between progress lines
WATCH_BACKLOG = 10_000   # events a watch client may fall behind before it is dropped


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
            req = _parse(line)
            if isinstance(req, dict) and req.get("op") == "watch":
                await _watch(stream, ops, req.get("args", {}).get("path"))
                return  # a watch holds its connection until the client or the daemon goes
            await _send(stream, await _dispatch(req, ops, stream))


async def _send(stream: trio.SocketStream, msg: dict[str, Any]) -> None:
    await stream.send_all(json.dumps(msg).encode() + b"\n")


def _parse(line: bytes) -> dict[str, Any]:
    """The request, or a ready error reply (marked by "ok") when it is malformed."""
    try:
        req = json.loads(line)
        if not isinstance(req, dict) or not isinstance(req.get("args", {}), dict) or not isinstance(req.get("op"), str):
            raise ValueError
        return req
    except ValueError:
        return {"ok": False, "error": "malformed request", "errno": errno.EINVAL}


async def _dispatch(req: dict[str, Any], ops: Any, stream: trio.SocketStream) -> dict[str, Any]:
    if "ok" in req:
        return req
    op = req["op"]
    fn = service.OPS.get(op)
    if fn is None:
        return {"ok": False, "error": f"unknown request {op!r}", "errno": errno.EINVAL}
    args = {k: decode(v) for k, v in req.get("args", {}).items()}
    if op == "fsck" and args.get("repair"):
        return {"ok": False, "error": f"{ops.store.root}: fsck --repair needs the store unmounted "
                "(a check without --repair runs while mounted)", "errno": errno.EBUSY}
    try:
        if req.get("progress") and op in service.WITH_PROGRESS:
            result = await _run_reporting_progress(functools.partial(fn, ops.store, **args), stream)
        else:
            result = await trio.to_thread.run_sync(functools.partial(fn, ops.store, **args))
    except CowfsError as e:
        return {"ok": False, "error": str(e), "errno": e.errno}
    except TypeError as e:
        return {"ok": False, "error": f"bad arguments for {op}: {e}", "errno": errno.EINVAL}
    except Exception as e:  # noqa: BLE001 - reported to the client and logged, never kills the daemon
        log.exception("control request %s failed", op)
        return {"ok": False, "error": f"{op} failed: {e}", "errno": errno.EIO}
    await _after(op, args, result)
    return {"ok": True, "result": encode(result)}


async def _run_reporting_progress(fn: Callable[..., Any], stream: trio.SocketStream) -> Any:
    """Run fn(progress=...) in a thread; send {"progress": [done, total]} lines (at most ~10/s) meanwhile."""
    send, recv = trio.open_memory_channel(math.inf)
    last = 0.0

    def progress(done: int, total: int) -> None:
        nonlocal last
        now = time.monotonic()
        if done < total and now - last < PROGRESS_INTERVAL:
            return
        last = now
        trio.from_thread.run_sync(send.send_nowait, [done, total])

    async def forward() -> None:
        async for msg in recv:
            await _send(stream, {"progress": msg})

    async with trio.open_nursery() as nursery:
        nursery.start_soon(forward)
        try:
            return await trio.to_thread.run_sync(functools.partial(fn, progress=progress))
        finally:
            send.close()


async def _after(op: str, args: dict[str, Any], result: Any) -> None:
    """Drop what the kernel caches about things a request changed."""
    if op == "restore":  # the live file (or the new directory's parent) changed under the kernel's caches
        for ino in (result["ino"], result.get("parent_ino")):
            if ino is None:
                continue
            try:
                await trio.to_thread.run_sync(pyfuse3.invalidate_inode, ino)
            except Exception:  # noqa: BLE001 - not cached: nothing to drop
                pass
    gone: list[str] = []
    if op == "snapshot_delete":
        gone = list(args.get("names", []))
    elif op == "prune" and not result["dry_run"]:
        gone = [s["name"] for s in result["snapshots"] if not s["keep"]]
    for name in gone:  # the kernel may still hold .snapshots/NAME in its dentry cache
        pyfuse3.invalidate_entry_async(SNAPDIR_INO, name.encode())


async def _watch(stream: trio.SocketStream, ops: Any, path: Any) -> None:
    """Push one {"event": {...}} line per change under `path` until the client or the daemon goes.
    A client too slow to keep up with WATCH_BACKLOG events gets an error line and is dropped."""
    if path is not None and not isinstance(path, str):
        await _send(stream, {"ok": False, "error": "watch: path must be a string", "errno": errno.EINVAL})
        return
    send, recv = trio.open_memory_channel(WATCH_BACKLOG)
    token = trio.lowlevel.current_trio_token()
    overflow = threading.Event()

    def deliver(event: Event) -> None:  # any thread: hand over to the trio loop and return
        if path is None or event.touches(path):
            token.run_sync_soon(offer, event)

    def offer(event: Event) -> None:  # on the trio loop
        try:
            send.send_nowait(event)
        except trio.WouldBlock:
            overflow.set()
            send.close()
        except trio.ClosedResourceError:
            pass

    # the store's changes, and on a node's own mount of the job's namespace (union_ops.py) the
    # other stores' changes where it shows them
    buses = [ops.store.events, *([ops.peer_events] if hasattr(ops, "peer_events") else [])]
    unsubscribes = [bus.subscribe(deliver) for bus in buses]
    try:
        await _send(stream, {"ok": True, "result": {"watching": path or "/"}})
        async with trio.open_nursery() as nursery:
            async def hangup() -> None:  # the client went away: stop waiting for events
                while await stream.receive_some(4096):
                    pass
                nursery.cancel_scope.cancel()

            nursery.start_soon(hangup)
            async for event in recv:
                await _send(stream, {"event": event.to_json()})
            if overflow.is_set():
                await _send(stream, {"ok": False, "error": f"watch: more than {WATCH_BACKLOG} events behind; "
                                     "dropped (watch again to resume)", "errno": errno.ENOBUFS})
            nursery.cancel_scope.cancel()
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    finally:
        for unsubscribe in unsubscribes:
            unsubscribe()
        send.close()


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
