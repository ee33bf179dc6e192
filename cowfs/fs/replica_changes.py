"""What a consumer's daemon does once its catalog moved to a newer generation: the kernel
drops what it caches of the entries and inodes that changed, and `cowfs watch`
subscribers get the events (remote/changes.py), for one store's replica and for the merged
tree of every store alike; and what it does when a step failed: `Retry`."""
from __future__ import annotations

import time
from typing import Any

import pyfuse3
import trio

from ..remote.changes import Changes
from ..remote.changes import events as watch_events
from ..remote.replica import Replica
from ..store.catalog.events import SNAPSHOT, Event
from .views import LIVE_VIEW, ViewTable

RETRY_FIRST, RETRY_MAX = 1.0, 30.0  # a failed step is tried again after these (doubling)


def events_between(replica: Replica, changes: Changes) -> list[Event]:
    """The watch events of a move to a newer generation: the changed files' (remote/changes.py)
    and the snapshots taken since."""
    out = replica.catalog.read(lambda conn: watch_events(conn, changes))
    now = time.time_ns()
    for s in replica.snapshot_list():
        if s.gen > changes.old and s.created_ns and s.gen <= changes.new:
            out.append(Event(SNAPSHOT, changes.new, now, snapshot=s.name))
    return out


def _invalidate_inodes(inos: set[int]) -> None:
    """(a worker thread: the call blocks in the kernel) Drop what the kernel caches of them."""
    for ino in inos:
        try:
            pyfuse3.invalidate_inode(ViewTable.encode(LIVE_VIEW, ino))
        except Exception:  # noqa: BLE001 - not cached: nothing to drop
            pass


async def tell(replica: Replica, changes: Changes) -> None:
    """Invalidate what changed and publish its watch events."""
    for parent, name in changes.entries:
        pyfuse3.invalidate_entry_async(ViewTable.encode(LIVE_VIEW, parent), name, ignore_enoent=True)
    await trio.to_thread.run_sync(_invalidate_inodes, changes.inos)  # one hop, however many
    if replica.events.active:
        events = await trio.to_thread.run_sync(events_between, replica, changes)
        replica.events.publish(events)


class Retry:
    """A step that failed (the bucket unreachable, an engine restarting) is sent into the
    follower's channel again after 1, 2, 4 ... 30 s: a producer with nothing new sends no
    other notice, so without this a consumer would stay behind until the next change."""

    def __init__(self, send: trio.MemorySendChannel[Any]) -> None:
        self.send = send
        self.delay = RETRY_FIRST

    def succeeded(self) -> None:
        self.delay = RETRY_FIRST

    async def later(self, *items: Any) -> None:
        delay, self.delay = self.delay, min(self.delay * 2, RETRY_MAX)
        await trio.sleep(delay)
        for item in items:
            self.send.send_nowait(item)
