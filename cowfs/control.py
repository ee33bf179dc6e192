"""Reach a store from the CLI: directly when unmounted, through its daemon when mounted
(the wire format is in protocol.py)."""
from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from .errors import CowfsError, StoreError
from .mountinfo import mounted_cowfs
from .protocol import SOCKET_NAME, decode, encode, short_path
from .store.log.layout import CONFIG_FILE, LOCK_FILE

if TYPE_CHECKING:
    from .store import Store

Progress = Callable[[int, int], None]


class DirectTarget:
    """An unmounted store, opened by this process. The engine is imported here, not with this
    module: a command that goes to a daemon (DaemonTarget) starts without it."""

    mounted = False

    def __init__(self, store_path: Path) -> None:
        from . import service_remote  # noqa: PLC0415 - the engine, only for an unmounted store
        from .store import Store  # noqa: PLC0415

        self.store: Store = Store.open(store_path, pack_reader=service_remote.pack_reader)

    def call(self, op: str, progress: Progress | None = None, **args: Any) -> Any:
        from . import service  # noqa: PLC0415

        if progress is not None and op in service.WITH_PROGRESS:
            args["progress"] = progress
        return service.OPS[op](self.store, **args)

    def watch(self, path: str | None) -> Iterator[dict[str, Any]]:
        raise StoreError(f"{self.store.root}: the store is not mounted; watch follows the changes a mounted "
                         "store's daemon commits (mount it first)")

    def close(self) -> None:
        self.store.close()


class DaemonTarget:
    """A mounted store: every call is a request to its daemon."""

    mounted = True

    def __init__(self, store_path: Path) -> None:
        self.store_path = store_path
        dir_fd = os.open(store_path, os.O_PATH | os.O_DIRECTORY)
        try:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                self.sock.connect(short_path(dir_fd, SOCKET_NAME))
            except OSError as e:
                self.sock.close()
                raise StoreError(f"{store_path}: its daemon does not answer ({e.strerror})") from None
        finally:
            os.close(dir_fd)
        self.rfile = self.sock.makefile("rb")

    def _send(self, op: str, args: dict[str, Any], **extra: Any) -> None:
        line = json.dumps({"op": op, "args": {k: encode(v) for k, v in args.items()}, **extra}) + "\n"
        self.sock.sendall(line.encode())

    def _receive(self) -> dict[str, Any] | None:
        """The next message, or None when the daemon closed the connection (unmounted)."""
        line = self.rfile.readline()
        return json.loads(line) if line else None

    def _result(self, msg: dict[str, Any] | None) -> Any:
        if msg is None:
            raise CowfsError(f"{self.store_path}: the daemon closed the connection", errno=errno.EPIPE)
        if not msg.get("ok"):
            raise CowfsError(msg.get("error", "request failed"), errno=msg.get("errno", errno.EIO))
        return decode(msg.get("result"))

    def call(self, op: str, progress: Progress | None = None, **args: Any) -> Any:
        self._send(op, args, **({"progress": True} if progress is not None else {}))
        while True:
            msg = self._receive()
            if msg is not None and "progress" in msg and "ok" not in msg:
                if progress is not None:
                    progress(*msg["progress"])
                continue
            return self._result(msg)

    def watch(self, path: str | None) -> Iterator[dict[str, Any]]:
        """Subscribe, and return once the daemon watches (no change after this is missed):
        the events as the daemon pushes them; they end when the store is unmounted."""
        self._send("watch", {"path": path} if path else {})
        self._result(self._receive())
        return self._events()

    def _events(self) -> Iterator[dict[str, Any]]:
        while (msg := self._receive()) is not None:
            if "event" not in msg:
                self._result(msg)  # an error line: raises
                continue
            yield msg["event"]

    def close(self) -> None:
        self.rfile.close()
        self.sock.close()


def _locked(store: Path) -> bool:
    try:
        fd = os.open(store / LOCK_FILE, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def store_of(target: str) -> Path:
    """The store behind TARGET: a store directory, or the mountpoint of a mounted store."""
    path = Path(target).absolute()
    mounts = mounted_cowfs()
    if str(path) in mounts:
        return Path(mounts[str(path)])
    if (path / CONFIG_FILE).exists() or not path.exists():
        return path
    raise StoreError(f"{path}: not a cowfs store, nor the mountpoint of a mounted one")


def open_target(target: str) -> DirectTarget | DaemonTarget:
    store = store_of(target)
    # a live daemon: of a store, or of a remote mount's cache (which has no store config)
    if _locked(store) and (store / SOCKET_NAME).exists():
        return DaemonTarget(store)
    return DirectTarget(store)


class Target:
    """`with Target(path) as t: t.call(...)`"""

    def __init__(self, target: str) -> None:
        self.impl = open_target(target)

    def __enter__(self) -> DirectTarget | DaemonTarget:
        return self.impl

    def __exit__(self, *exc: object) -> None:
        self.impl.close()
