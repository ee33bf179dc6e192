"""The control socket's wire format, shared by the CLI (client) and the daemon (server).

The daemon listens on STORE/daemon.sock. The protocol is JSON lines: a request
{"op": NAME, "args": {...}}, then one response {"ok": true, "result": ...} or
{"ok": false, "error": MESSAGE, "errno": N}. Bytes travel base64-encoded
({"b64": ...}). A request with "progress": true (gc, fsck, prune) may get
{"progress": [DONE, TOTAL]} lines before its response; a "watch" request gets
its response, then one {"event": {...}} line per change. See docs/cli.md.
"""
from __future__ import annotations

import base64
import os
from typing import Any

SOCKET_NAME = "daemon.sock"


def bulk_socket_name(st_dev: int) -> str:
    """The abstract unix socket on which the daemon of the cowfs mount whose files have device
    `st_dev` moves files' bytes without FUSE requests (fs/bulk_server.py, plugins/bulk.py).
    Wire format: one message per connection, a JSON line with descriptors (SCM_RIGHTS), and
    one JSON line back, as on the control socket:
      {"op": "put", "fd": F, "size": N, "more": M} with a memfd holding the part's N bytes
        from offset 0 (F: the client's descriptor of the file, opened for writing through
        the mount), then while M, {"size": N, "more": M} with a memfd each: the parts'
        bytes become the file's new version (a memfd sealed against writes and shrinking is
        read in place, any other is copied first);
      {"op": "get", "fd": F} (F opened for reading through the mount): the reply
        {"ok": true, "result": {"size": N, ...}} carries a sealed memfd of its N bytes; with
        "into": true and a memfd of the client's (writable, sealed against shrinking only),
        the daemon fills that memfd's first N bytes instead and the reply carries none."""
    return f"\0cowfs-bulk-{os.major(st_dev)}:{os.minor(st_dev)}"


def encode(value: Any) -> Any:
    return {"b64": base64.b64encode(value).decode()} if isinstance(value, bytes) else value


def decode(value: Any) -> Any:
    if isinstance(value, dict) and set(value) == {"b64"}:
        return base64.b64decode(value["b64"])
    return value


def short_path(dir_fd: int, name: str) -> str:
    """A path to `name` in the directory `dir_fd` short enough for a unix socket address."""
    return f"/proc/self/fd/{dir_fd}/{name}"
