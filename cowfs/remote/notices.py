"""Pushed notices of new versions, from a producer's daemon to consumers (no polling).

The producer (`cowfs remote set ... --notify HOST:PORT`) listens on that address and, after
each upload pass, sends every connected consumer one JSON line:
`{"store": UUID, "generation": G, "key": CATALOG_KEY}`; a consumer that connects gets the
newest one at once, so one that was away catches up on connecting. The producer writes
where it listens to `stores/UUID/notify.json` (the one object in the bucket that changes:
it holds no data). A consumer reads it when it connects, and again after the connection
drops (the producer may have restarted elsewhere), with backoff.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from typing import Any, Callable

from ..errors import InvalidArgument, RemoteError
from .config import parse_address
from .s3 import Bucket

log = logging.getLogger("cowfs.notices")
SEND_TIMEOUT = 2.0  # a consumer that takes no line for this long is dropped
RETRY_FIRST, RETRY_MAX = 0.2, 10.0


def notify_key(bucket: Bucket, store_uuid: str) -> str:
    return bucket.key("stores", store_uuid, "notify.json")


class NoticeServer:
    def __init__(self, address: str, bucket: Bucket, store_uuid: str) -> None:
        self.configured = address
        host, port = parse_address(address)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.sock.listen(64)
        self.address = f"{host}:{self.sock.getsockname()[1]}"
        self.bucket = bucket
        self.store_uuid = store_uuid
        self._clients: list[socket.socket] = []
        self._lock = threading.Lock()
        self._latest: bytes | None = None
        self._closed = False
        self.published = False
        threading.Thread(target=self._accept, name="cowfs-notices", daemon=True).start()

    def publish_address(self) -> None:
        """Write notify.json (RemoteError if the bucket refuses; tried again at the next notice)."""
        body = {"format": "cowfs-notify", "version": 1, "address": self.address, "pid": os.getpid(),
                "started_ns": time.time_ns()}
        self.bucket.put(notify_key(self.bucket, self.store_uuid), json.dumps(body).encode())
        self.published = True

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.settimeout(SEND_TIMEOUT)
            with self._lock:
                latest = self._latest
                self._clients.append(conn)
            if latest is not None:
                self._send(conn, latest)

    def _send(self, conn: socket.socket, line: bytes) -> None:
        try:
            conn.sendall(line)
        except OSError:
            with self._lock:
                if conn in self._clients:
                    self._clients.remove(conn)
            conn.close()

    def notify(self, generation: int, key: str) -> None:
        line = json.dumps({"store": self.store_uuid, "generation": generation, "key": key}).encode() + b"\n"
        with self._lock:
            self._latest = line
            clients = list(self._clients)
        for conn in clients:
            self._send(conn, line)

    def close(self) -> None:
        self._closed = True
        self.sock.close()
        with self._lock:
            for conn in self._clients:
                conn.close()
            self._clients.clear()


class NoticeListener:
    """Calls `on_notice(generation, key)` in its own thread for each notice of `store_uuid`."""

    def __init__(self, bucket: Bucket, store_uuid: str, on_notice: Callable[[int, str], None]) -> None:
        self.bucket, self.store_uuid, self.on_notice = bucket, store_uuid, on_notice
        self._stop = threading.Event()
        self._sock: socket.socket | None = None
        self.connected = threading.Event()
        self.thread = threading.Thread(target=self._run, name="cowfs-notice-listener", daemon=True)
        self.thread.start()

    def _address(self) -> tuple[str, int] | None:
        try:
            info: dict[str, Any] = json.loads(self.bucket.get(notify_key(self.bucket, self.store_uuid)))
            return parse_address(str(info["address"]))
        except (RemoteError, ValueError, KeyError, InvalidArgument):
            return None

    def _run(self) -> None:
        retry = RETRY_FIRST
        while not self._stop.is_set():
            addr = self._address()
            if addr is not None:
                try:
                    with socket.create_connection(addr, timeout=5) as sock:
                        sock.settimeout(None)
                        self._sock = sock
                        self.connected.set()
                        retry = RETRY_FIRST
                        for line in sock.makefile("rb"):
                            msg = json.loads(line)
                            if msg.get("store") != self.store_uuid:
                                continue
                            try:
                                self.on_notice(int(msg["generation"]), str(msg["key"]))
                            except Exception:  # noqa: BLE001 - one bad notice must not end the listener
                                log.exception("notice %s not handled", msg)
                except (OSError, ValueError, KeyError) as e:
                    if not self._stop.is_set():
                        log.info("notices from %s: %s", addr, e)
                finally:
                    self._sock = None
                    self.connected.clear()
            self._stop.wait(retry)
            retry = min(retry * 2, RETRY_MAX)

    def stop(self) -> None:
        """Tell the thread to end (it ends at its next wait, or as its connection drops)."""
        self._stop.set()
        sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self.stop()
        self.thread.join(timeout=10)


def close_all(listeners: list[NoticeListener]) -> None:
    """End many listeners in the time of one: each told first, then each waited for."""
    for listener in listeners:
        listener.stop()
    deadline = time.monotonic() + 10
    for listener in listeners:
        listener.thread.join(timeout=max(deadline - time.monotonic(), 0.01))
