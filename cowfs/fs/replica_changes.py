"""What a consumer's daemon does once its catalog moved to a newer generation: the kernel
drops what it caches of the entries and inodes that changed, and `cowfs watch`
subscribers get the events (remote/changes.py), for one store's replica and for the merged
tree of every store alike."""
from __future__ import annotations

import time

import pyfuse3
import trio

from ..remote.changes import Changes
from ..remote.changes import events as watch_events
from ..remote.replica import Replica
from ..store.catalog.events import SNAPSHOT, Event
from .views import LIVE_VIEW, ViewTable


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
