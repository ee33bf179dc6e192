"""Change events: what the store publishes after each committed change.

Subscribers (the mount daemon's `watch` connections) are called in the thread
that committed the change, after the transaction is durable, so they must only
hand the event on (e.g. to an event loop) and return. With no subscriber the
store does not even build events.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import asdict, dataclass
from typing import Any, Callable

log = logging.getLogger("cowfs.events")

# kinds of event
VERSION = "version"            # a file's new content was committed (close, fsync, truncate, restore)
RENAME = "rename"              # path moved from old_path
REMOVE = "remove"              # a file, symlink or directory was removed from the live tree
LINK = "link"                  # a hard link: path is a new name of an existing file
SNAPSHOT = "snapshot"          # a snapshot was created
SNAPSHOT_DELETE = "snapshot-delete"


@dataclass(frozen=True)
class Event:
    kind: str
    generation: int
    time_ns: int
    path: str | None = None
    old_path: str | None = None       # rename: where it was
    size: int | None = None           # version, rename of a file: its size
    added_bytes: int | None = None    # version: bytes of chunks this commit stored for the first time
    snapshot: str | None = None       # snapshot, snapshot-delete: the name

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    def touches(self, path: str) -> bool:
        """Whether this event concerns `path` or something under it (snapshots concern every path)."""
        if self.kind in (SNAPSHOT, SNAPSHOT_DELETE):
            return True
        root = "/" + path.strip("/")
        if root == "/":
            return True
        return any(p is not None and (p == root or p.startswith(root + "/")) for p in (self.path, self.old_path))


Subscriber = Callable[[Event], None]


class EventBus:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subscribers: list[Subscriber] = []

    @property
    def active(self) -> bool:
        return bool(self._subscribers)

    def subscribe(self, fn: Subscriber) -> Callable[[], None]:
        """Call `fn` for every event from now on; returns the function that stops it."""
        with self._lock:
            self._subscribers.append(fn)

        def unsubscribe() -> None:
            with self._lock:
                if fn in self._subscribers:
                    self._subscribers.remove(fn)

        return unsubscribe

    def publish(self, events: list[Event]) -> None:
        with self._lock:
            subscribers = list(self._subscribers)
        for event in events:
            for fn in subscribers:
                try:
                    fn(event)
                except Exception:  # noqa: BLE001 - a broken subscriber must not fail the commit that already happened
                    log.exception("event subscriber failed; dropping it")
                    with self._lock:
                        if fn in self._subscribers:
                            self._subscribers.remove(fn)
