"""One log line per damaged file version that a read or open ran into, not one per request."""
from __future__ import annotations

import logging
import time
from typing import Callable

from ..errors import CorruptData, CowfsError
from ..store import Store
from .views import View

log = logging.getLogger("cowfs.fs")

CORRUPT_LOG_INTERVAL = 10.0  # seconds between log lines about the same damaged file version


class CorruptLog:
    """`store_of(view)`: the store whose inodes the view numbers (a mount's own, or its peers')."""

    def __init__(self, store_of: Callable[[View], Store]) -> None:
        self.store_of = store_of
        self._reported: dict[tuple[int, int, int], tuple[float, int]] = {}  # (store, ino, vid) -> (logged at, missed)

    def report(self, view: View, ino: int, e: CorruptData, what: str) -> None:
        """Log a read that failed its checks: one line naming the path and version; further
        failures of that version within CORRUPT_LOG_INTERVAL are counted into its next line."""
        ino = e.ino if e.ino is not None else ino
        store = self.store_of(view)
        key = (id(store), ino, e.vid or 0)
        now = time.monotonic()
        last, missed = self._reported.get(key, (float("-inf"), 0))
        if now - last < CORRUPT_LOG_INTERVAL:
            self._reported[key] = (last, missed + 1)
            return
        self._reported[key] = (now, 0)
        try:
            paths = store.paths_of(ino, view.gen if view.gen is not None else store.generation)
            where = ", ".join(paths or store.paths_of(ino)) or f"inode {ino}"
        except CowfsError:  # a damaged catalog may not tell
            where = f"inode {ino}"
        version = f" version {e.vid} (generation {e.generation})" if e.vid is not None else ""
        seen = f" in snapshot {view.name}" if view.gen is not None else "" if view.live else " (another node's file)"
        log.error("corrupt data: %s%s%s: %s failed: %s%s", where, seen,
                  version, what, e, f" ({missed} more failures of it since the last report)" if missed else "")
