"""`--snapshot-on checkpoint` on a consumer of every store (`--all-stores`): each checkpoint
that completes in the union is snapshotted, pinned in the bucket (remote/pins.py), as of the
merged generation that completed it.

The changes come from the consumer's own watch events (each merged step publishes them,
fs/replica_changes.py), matched by the same rules as a producer's (store/checkpoints/rules.py)
and checked the same way (store/checkpoints/snapshot.py). Across stores a DCP `.metadata` can
arrive before another node's `.distcp` files: such a checkpoint is remembered, and looked at
again when a file arrives in its directory, so it is pinned once whole, never before.
Everything in the union is committed, so no snapshot waits for writers. At mount, the
checkpoints of the union's live tree that no pin names yet (completed while no such consumer
was mounted) are pinned first.
"""
from __future__ import annotations

import logging
import math
from dataclasses import replace
from typing import Any

import trio

from ..remote.replica import Replica
from ..store.catalog.events import VERSION, Event
from ..store.catalog import namespace as ns
from ..store.checkpoints import snapshot as ckpt
from ..store.checkpoints.rules import (DCP, DCP_METADATA, DEEPSPEED, DEEPSPEED_LATEST, TRAINER, LightningLast, Trigger,
                                       detect)
from ..store.checkpoints.trainer_state import STATE_FILE
from ..store.checkpoints.walk import ALL_KINDS, TreeWalker
from .dispatch import in_thread
from .snapshot_tasks import failures_logged, planned

log = logging.getLogger("cowfs.snapshots")


def _directory(path: str) -> str:
    return path.rsplit("/", 1)[0] or "/"


async def union_checkpoint_snapshots(replica: Replica, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """Pin a snapshot of every checkpoint that completes in the union from now on."""
    send, recv = trio.open_memory_channel[Trigger](math.inf)
    waiting: dict[str, Trigger] = {}  # a DCP checkpoint's directory -> its .metadata's trigger, files missing

    def deliver(event: Event) -> None:  # on the trio thread (replica_changes.tell publishes there)
        try:
            trigger = detect(event)
            if trigger is None and event.kind == VERSION and event.path:
                held = waiting.get(_directory(event.path))
                if held is not None:  # a late data file of a checkpoint whose .metadata came first
                    trigger = replace(held, generation=event.generation)
            if trigger is not None:
                send.send_nowait(trigger)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the daemon is stopping
        except Exception:  # noqa: BLE001 - raising would unsubscribe it for good (EventBus)
            log.exception("checkpoint detection failed for %s", event)

    unsubscribe = replica.events.subscribe(deliver)
    task_status.started()
    lightning = LightningLast()
    try:
        async with recv:
            for trigger in await in_thread(unpinned, replica):  # complete before this mount
                await _pin(replica, trigger, lightning, waiting)
            async for trigger in recv:
                await _pin(replica, trigger, lightning, waiting)
    finally:
        unsubscribe()


def unpinned(replica: Replica) -> list[Trigger]:
    """(a worker thread, at mount) A trigger for each checkpoint of the union's live tree whose
    snapshot name no pin has: those completed while no consumer with `--snapshot-on` was
    mounted. A pin of that name counts as holding it (a checkpoint saved again at the same
    path since its pin is not pinned again here)."""
    names = {s.name for s in replica.snapshot_list()}

    def fn(conn):  # type: ignore[no-untyped-def]
        gen = ns.current_gen(conn)
        out = []
        for found in TreeWalker(conn).checkpoints(gen, "/", ALL_KINDS):
            completing = {TRAINER: f"{found.path}/{STATE_FILE}", DCP: f"{found.path}/{DCP_METADATA}",
                          DEEPSPEED: f"{found.path.rsplit('/', 1)[0]}/{DEEPSPEED_LATEST}"}.get(found.kind, found.path)
            out.append(Trigger(found.kind, completing, gen))
        return out

    triggers = replica.catalog.read(fn)
    wanted = []
    for t in triggers:
        try:
            if ckpt.plan(replica, t).name not in names:
                wanted.append(t)
        except ckpt.NotComplete:
            continue
    return wanted


async def _pin(replica: Replica, trigger: Trigger, lightning: LightningLast, waiting: dict[str, Trigger]) -> None:
    with failures_logged(trigger):
        try:
            plan = await planned(replica, trigger, lightning)
        except ckpt.MissingFiles as e:
            waiting[e.directory] = trigger
            log.info("no checkpoint snapshot for %s at generation %d yet: %s", trigger.path, trigger.generation, e)
            return
        directory = _directory(trigger.path)
        if waiting.get(directory) is not None and waiting[directory].path == trigger.path:
            del waiting[directory]
        if plan is None:
            return
        snap = await in_thread(ckpt.take, replica, plan.name, trigger.generation)
        log.info("checkpoint snapshot %s (generation %d) of %s, pinned in the bucket", snap.name, snap.gen,
                 plan.checkpoint)
