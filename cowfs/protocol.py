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
from typing import Any

SOCKET_NAME = "daemon.sock"


def encode(value: Any) -> Any:
    return {"b64": base64.b64encode(value).decode()} if isinstance(value, bytes) else value


def decode(value: Any) -> Any:
    if isinstance(value, dict) and set(value) == {"b64"}:
        return base64.b64decode(value["b64"])
    return value


def short_path(dir_fd: int, name: str) -> str:
    """A path to `name` in the directory `dir_fd` short enough for a unix socket address."""
    return f"/proc/self/fd/{dir_fd}/{name}"
