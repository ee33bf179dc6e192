"""Pushed notices of new versions, from a producer's daemon to consumers (no polling).

The producer (`cowfs remote set ... --notify HOST:PORT`) listens on that address and, after
each upload pass, sends every connected consumer one JSON line:
`{"store": UUID, "generation": G, "key": CATALOG_KEY}`; a consumer that connects gets the
newest one at once, so one that was away catches up on connecting. The producer writes
where it listens to `stores/UUID/notify.json` (the one object in the bucket that changes:
it holds no data). A consumer reads it when it connects, and again after the connection
drops (the producer may have restarted elsewhere), with backoff.

A notice may carry the catalog object it names, as PUT, and the index objects of the packs
the pass PUT (`Inline`, when together they are at most INLINE_MAX bytes), so that a
consumer applies it without a request to the bucket. Such a line is signed: an HMAC-SHA256
under a key the daemon draws at start and writes to `notify.json`, so only a party that can
read the bucket can make one; a line whose signature does not check is used as a plain
notice (docs/format.md section 9.6).
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import InvalidArgument, RemoteError
from .config import parse_address
from .s3 import Bucket

log = logging.getLogger("cowfs.notices")
SEND_TIMEOUT = 2.0  # a consumer that takes no line for this long is dropped
RETRY_FIRST, RETRY_MAX = 0.2, 10.0
INLINE_MAX = 256 << 10  # bytes of catalog object and pack indexes a notice may carry (4/3 of it in base64)


@dataclass(frozen=True)
class Inline:
    """What a notice carries beside the key: the catalog object `key` names, as PUT
    (zstd-compressed), and the index objects of the packs its pass PUT, by pack name."""
    catalog: bytes
    indexes: dict[str, bytes] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return len(self.catalog) + sum(len(v) for v in self.indexes.values())


@dataclass(frozen=True)
class Notice:
    store: str
    generation: int
    key: str
    inline: Inline | None = None  # None: the consumer reads the objects from the bucket


def _signed_part(msg: dict[str, Any]) -> bytes:
    """The bytes a line's signature covers: every field but "mac", in one canonical form."""
    return json.dumps({k: v for k, v in msg.items() if k != "mac"}, sort_keys=True, separators=(",", ":")).encode()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def encode_notice(store: str, generation: int, key: str, inline: Inline | None, mac_key: bytes) -> bytes:
    """One line of the stream; `inline` is carried (and the line signed) only when it is at
    most INLINE_MAX bytes."""
    msg: dict[str, Any] = {"store": store, "generation": generation, "key": key}
    if inline is not None and inline.size <= INLINE_MAX:
        msg["catalog"] = _b64(inline.catalog)
        msg["indexes"] = {name: _b64(data) for name, data in sorted(inline.indexes.items())}
        msg["mac"] = hmac.new(mac_key, _signed_part(msg), hashlib.sha256).hexdigest()
    return json.dumps(msg).encode() + b"\n"


def decode_notice(line: bytes, mac_key: bytes | None) -> Notice:
    """A line of the stream (ValueError or KeyError if it is not one). What it carries
    inline is kept only if its signature checks under `mac_key` (None: the producer
    published no key, so nothing inline is trusted)."""
    msg = json.loads(line)
    notice = Notice(str(msg["store"]), int(msg["generation"]), str(msg["key"]))
    if "catalog" not in msg:
        return notice
    mac = msg.get("mac")
    good = mac_key is not None and isinstance(mac, str) and hmac.compare_digest(
        mac, hmac.new(mac_key, _signed_part(msg), hashlib.sha256).hexdigest())
    if not good:
        log.warning("a notice of store %s generation %d carries objects whose signature does not check: "
                    "they are read from the bucket instead", notice.store, notice.generation)
        return notice
    try:
        inline = Inline(base64.b64decode(msg["catalog"], validate=True),
                        {str(n): base64.b64decode(d, validate=True) for n, d in dict(msg["indexes"]).items()})
    except (ValueError, TypeError, KeyError):
        return notice
    return Notice(notice.store, notice.generation, notice.key, inline)


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
        self.mac_key = os.urandom(32)  # signs what notices carry inline; in notify.json for consumers
        self._clients: list[socket.socket] = []
        self._lock = threading.Lock()
        self._latest: bytes | None = None
        self._closed = False
        self.published = False
        threading.Thread(target=self._accept, name="cowfs-notices", daemon=True).start()

    def publish_address(self) -> None:
        """Write notify.json (RemoteError if the bucket refuses; tried again at the next notice)."""
        body = {"format": "cowfs-notify", "version": 2, "address": self.address, "pid": os.getpid(),
                "started_ns": time.time_ns(), "mac_key": self.mac_key.hex()}
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

    def notify(self, generation: int, key: str, inline: Inline | None = None) -> None:
        line = encode_notice(self.store_uuid, generation, key, inline, self.mac_key)
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
    """Calls `on_notice(notice)` in its own thread for each notice of `store_uuid`."""

    def __init__(self, bucket: Bucket, store_uuid: str, on_notice: Callable[[Notice], None]) -> None:
        self.bucket, self.store_uuid, self.on_notice = bucket, store_uuid, on_notice
        self._stop = threading.Event()
        self._sock: socket.socket | None = None
        self.connected = threading.Event()
        self.thread = threading.Thread(target=self._run, name="cowfs-notice-listener", daemon=True)
        self.thread.start()

    def _address(self) -> tuple[tuple[str, int], bytes | None] | None:
        """Where the producer listens, and the key its inline objects are signed with (None:
        a producer that signs nothing)."""
        try:
            info: dict[str, Any] = json.loads(self.bucket.get(notify_key(self.bucket, self.store_uuid)))
            mac_key = info.get("mac_key")
            return parse_address(str(info["address"])), bytes.fromhex(mac_key) if isinstance(mac_key, str) else None
        except (RemoteError, ValueError, KeyError, InvalidArgument):
            return None

    def _run(self) -> None:
        retry = RETRY_FIRST
        while not self._stop.is_set():
            found = self._address()
            if found is not None:
                addr, mac_key = found
                try:
                    with socket.create_connection(addr, timeout=5) as sock:
                        sock.settimeout(None)
                        self._sock = sock
                        self.connected.set()
                        retry = RETRY_FIRST
                        for line in sock.makefile("rb"):
                            notice = decode_notice(line, mac_key)
                            if notice.store != self.store_uuid:
                                continue
                            try:
                                self.on_notice(notice)
                            except Exception:  # noqa: BLE001 - one bad notice must not end the listener
                                log.exception("notice of generation %d not handled", notice.generation)
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
