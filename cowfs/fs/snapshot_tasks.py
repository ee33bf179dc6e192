"""The snapshots the daemon takes by itself: `--auto-snapshot` (every interval) and
`--snapshot-on checkpoint` (each checkpoint as it completes). Both run as trio tasks that
only decide and wait; the catalog work is done in worker threads.

Checkpoint snapshots are event-driven: a store subscriber matches each committed change's
path against the rules (store/checkpoints/rules.py) on the committing thread and hands a
match to this loop; nothing is polled or scanned on the write path, and the FUSE request
that committed the change never waits for the snapshot.
"""
from __future__ import annotations

import datetime
import logging
import math
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import trio

from ..errors import CowfsError, HistoryDropped
from ..store import Store
from ..store.catalog.events import Event
from ..store.catalog.snapshots import Snapshot
from ..store.checkpoints import snapshot as ckpt
from ..store.checkpoints.rules import LightningLast, Trigger, detect
from .dispatch import in_thread
from .operations import CowfsOperations

log = logging.getLogger("cowfs.snapshots")
QUIET_POLL = 0.1  # seconds between looks at the writers while a snapshot waits for a quiet moment


class QuietMoments:
    """Snapshots of the tree as of now, one at a time, each at a moment when no file is open
    for writing or being created (so none shows a file a writer has not closed), with new
    creates held until it is taken (HandleTable.auto_snapshot_done)."""

    def __init__(self, ops: CowfsOperations) -> None:
        self.ops = ops
        self.lock = trio.Lock()

    async def snapshot(self, take: Callable[[], Snapshot]) -> Snapshot:
        async with self.lock:
            handles = self.ops.handles
            while handles.writers_open():
                await trio.sleep(QUIET_POLL)
            done = handles.auto_snapshot_done = trio.Event()  # no await since the look: still quiet
            try:
                return await in_thread(take)
            finally:
                handles.auto_snapshot_done = None
                done.set()


async def auto_snapshot(quiet: QuietMoments, interval: float) -> None:
    """Every `interval` seconds, a snapshot named by its UTC time, at a quiet moment."""
    store = quiet.ops.store

    def take() -> Snapshot:
        return store.snapshot_create(datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))

    while True:
        await trio.sleep(interval)
        try:
            snap = await quiet.snapshot(take)
            log.info("auto-snapshot %s", snap.name)
        except CowfsError as e:
            log.warning("auto-snapshot: %s", e)


async def checkpoint_snapshots(quiet: QuietMoments, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """Snapshot every checkpoint that completes, and at start every live Trainer checkpoint
    that no snapshot holds (one completed while the daemon was down or before it)."""
    ops = quiet.ops
    send, recv = trio.open_memory_channel(math.inf)  # matches are rare: one per checkpoint
    token = trio.lowlevel.current_trio_token()

    def offer(trigger: Trigger) -> None:  # on the trio loop
        try:
            send.send_nowait(trigger)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the daemon is stopping

    def deliver(event: Event) -> None:  # on the committing thread: match the path, hand over, return
        try:
            trigger = detect(event)
            if trigger is not None:
                token.run_sync_soon(offer, trigger)
        except trio.RunFinishedError:
            pass
        except Exception:  # noqa: BLE001 - raising would unsubscribe it for good (EventBus)
            log.exception("checkpoint detection failed for %s", event)

    unsubscribe = ops.store.events.subscribe(deliver)
    task_status.started()
    lightning = LightningLast()
    try:
        async with recv:
            try:
                missed = await in_thread(ckpt.missed, ops.store)
            except CowfsError as e:
                log.warning("looking for checkpoints without a snapshot: %s", e)
                missed = []
            for trigger in missed:
                await _snapshot_checkpoint(quiet, trigger, lightning)
            async for trigger in recv:
                await _snapshot_checkpoint(quiet, trigger, lightning)
    finally:
        unsubscribe()


async def planned(store: Store, trigger: Trigger, lightning: LightningLast) -> ckpt.Plan | None:
    """What to snapshot for `trigger`, or None when no snapshot is wanted (said in the log):
    Lightning's `last` copy, or a checkpoint a snapshot holds already. NotComplete if the
    change completed nothing."""
    plan = await in_thread(ckpt.plan, store, trigger)
    if not lightning.wanted(trigger):
        log.info("no checkpoint snapshot for %s: Lightning's copy of the checkpoint saved before it", trigger.path)
        return None
    held = await in_thread(ckpt.already_snapshotted, store, plan)
    if held is not None:
        log.info("no checkpoint snapshot for %s: snapshot %s holds it already", plan.checkpoint, held)
        return None
    return plan


@contextmanager
def failures_logged(trigger: Trigger) -> Iterator[None]:
    """A checkpoint snapshot's failure said in the log; the daemon goes on serving."""
    try:
        yield
    except ckpt.NotComplete as e:
        log.info("no checkpoint snapshot for %s at generation %d: %s", trigger.path, trigger.generation, e)
    except CowfsError as e:
        log.warning("checkpoint snapshot for %s failed: %s", trigger.path, e)
    except Exception:  # noqa: BLE001 - the daemon goes on serving
        log.exception("checkpoint snapshot for %s failed", trigger.path)


async def _snapshot_checkpoint(quiet: QuietMoments, trigger: Trigger, lightning: LightningLast) -> None:
    store = quiet.ops.store
    with failures_logged(trigger):
        plan = await planned(store, trigger, lightning)
        if plan is None:
            return
        # inodes with writes not yet committed (trio thread only); a session whose last FLUSH
        # committed everything and whose RELEASE has not come yet (the completing file's own) is not
        writing = [ino for ino, shared in quiet.ops.handles.sessions.items() if shared.session.dirty]
        snap = None
        if not await in_thread(ckpt.still_written, store, plan, writing):
            try:  # the tree exactly as the completing commit left it
                snap = await in_thread(ckpt.take, store, plan.name, trigger.generation)
            except HistoryDropped as e:
                log.info("checkpoint snapshot of %s: %s; taking it now instead", plan.checkpoint, e)
        else:
            log.info("checkpoint %s still being written: its snapshot waits until no file is open for writing",
                     plan.checkpoint)
        if snap is None:
            snap = await quiet.snapshot(lambda: ckpt.take_now(store, plan))
        log.info("checkpoint snapshot %s (generation %d) of %s", snap.name, snap.gen, plan.checkpoint)
