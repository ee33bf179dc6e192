"""A consumer of every store under a prefix (`--all-stores`) following them: each store's
notices (remote/notices.py) as they arrive, stores that appear under the prefix, and,
for a store from which no notices come (its remote has no `--notify`, or its daemon is
down), a look at the bucket every POLL_SECONDS, said once in the log. Each step is
merged (remote/merge.py) on a worker thread, then the kernel and `cowfs watch` are told
(replica_changes.py).
"""
from __future__ import annotations

import logging
import math
from typing import Awaitable, Callable

import trio

from ..errors import CowfsError
from ..remote.notices import Inline, Notice, NoticeListener, close_all
from ..remote.changes import Changes
from ..remote.union_source import UnionSource
from .replica_changes import Retry

log = logging.getLogger("cowfs.replica")
DISCOVER_SECONDS = 2.0  # how often the prefix is listed for new stores (no notice tells of a store's birth)
POLL_SECONDS = 2.0  # how often a store that sends no notices is looked at in the bucket
QUIET_SECONDS = 3.0  # a store's listener unconnected this long counts as sending no notices


class QuietStores:
    """Which followed stores send no notices: a store whose notice listener has been
    unconnected for QUIET_SECONDS since it was made (or last connected) is looked at in the
    bucket instead, said once in the log per quiet spell. One for a consumer of one store
    (replica_mount.py) and of every store under a prefix (below)."""

    def __init__(self) -> None:
        self._since: dict[str, float] = {}  # store -> when its listener was made or last seen connected
        self._said: set[str] = set()

    def listening(self, store: str, now: float) -> None:
        """A listener for `store` was just made: its quiet time counts from now."""
        self._since[store] = now
        self._said.discard(store)

    def should_look(self, store: str, connected: bool, now: float) -> bool:
        """Whether `store` is to be looked at in the bucket now."""
        if connected:
            self.listening(store, now)
            return False
        if now - self._since.setdefault(store, now) < QUIET_SECONDS:
            return False
        if store not in self._said:
            self._said.add(store)
            log.warning("store %s sends no notices (its remote has no --notify, or its daemon is down):"
                        " looking at the bucket every %.0f s", store, POLL_SECONDS)
        return True

    def forget(self, store: str) -> None:
        self._since.pop(store, None)
        self._said.discard(store)


def join_batch(wanted: dict[str, tuple[int, str]], carried: dict[str, Inline],
               notice: tuple[str, int, str, Inline | None]) -> None:
    """A notice (store, generation, key, what it carried) into a batch: the newest generation
    of each store is wanted, with what its own notice carried (none if it carried nothing)."""
    store, gen, key, inline = notice
    if gen > wanted.get(store, (0, ""))[0]:
        wanted[store] = (gen, key)
        carried.pop(store, None)
        if inline is not None:
            carried[store] = inline


async def follow_union(source: UnionSource, told: Callable[[Changes], Awaitable[None]]) -> None:
    """Follow every store of `source`; `told` is given what each merged step changed (the
    kernel's caches, watch events: replica_changes.tell for a consumer's mount, the peer view
    of a producer's, fs/union_ops.py)."""
    send, recv = trio.open_memory_channel[tuple[str, int, str, Inline | None]](math.inf)
    token = trio.lowlevel.current_trio_token()
    listeners: dict[str, NoticeListener] = {}
    quiet = QuietStores()

    def notice_for(store: str):  # type: ignore[no-untyped-def]
        def on_notice(notice: Notice) -> None:
            try:
                token.run_sync_soon(send.send_nowait, (store, notice.generation, notice.key, notice.inline))
            except trio.RunFinishedError:
                pass
        return on_notice

    async def watch_bucket() -> None:
        while True:
            try:
                await look_at_bucket()
                await learn_if_stale()
            except Exception:  # noqa: BLE001 - following goes on; the next look tries again
                log.exception("the prefix's stores not looked at")
            await trio.sleep(min(DISCOVER_SECONDS, POLL_SECONDS))

    async def learn_if_stale() -> None:
        """Packs a remote gc deleted forgotten, after steps applied from notices alone."""
        try:
            await trio.to_thread.run_sync(source.shared.learn_if_stale)
        except CowfsError as e:  # the bucket unreachable: the next look tries again
            log.warning("the bucket's pack indexes not looked at (tried again): %s", e)

    async def look_at_bucket() -> None:
        """New stores, gone stores, and stores that send no notices."""
        try:
            listed = await trio.to_thread.run_sync(source.listed_stores)
        except CowfsError as e:
            log.warning("the prefix's stores not listed: %s", e)
            listed = list(listeners)
        for store in listed:
            if store not in listeners:
                log.info("following store %s", store)
                listeners[store] = NoticeListener(source.bucket, store, notice_for(store))
                quiet.listening(store, trio.current_time())
                await _poll(store)  # its newest catalog now, whether or not it sends notices
        for store in [s for s in listeners if s not in listed]:
            await trio.to_thread.run_sync(listeners.pop(store).close)
            quiet.forget(store)
            if await trio.to_thread.run_sync(source.newest, store) is None:
                log.info("store %s has left the prefix", store)
                changes = await trio.to_thread.run_sync(source.forget, store)
                await told(changes)
        now = trio.current_time()
        for store, listener in listeners.items():
            if quiet.should_look(store, listener.connected.is_set(), now):
                await _poll(store)

    retry = Retry(send)

    async def _poll(store: str) -> None:
        newest = await trio.to_thread.run_sync(source.newest, store)
        if newest is not None and newest[0] > source.held(store):
            send.send_nowait((store, *newest, None))

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch_bucket)
            async for first in recv:
                wanted: dict[str, tuple[int, str]] = {}  # the notice and every one queued meanwhile: one batch
                carried: dict[str, Inline] = {}
                join_batch(wanted, carried, first)
                while True:
                    try:
                        join_batch(wanted, carried, recv.receive_nowait())
                    except trio.WouldBlock:
                        break
                wanted = {s: gk for s, gk in wanted.items() if gk[0] > source.held(s)}
                if not wanted:
                    continue
                started = trio.current_time()
                try:
                    changes, failed = await trio.to_thread.run_sync(source.steps, wanted, carried)
                except Exception as e:  # noqa: BLE001 - the mount goes on serving what it has, and tries again
                    log.warning("generations %s not merged (tried again): %s", wanted, e,
                                exc_info=not isinstance(e, CowfsError))
                    nursery.start_soon(retry.later, *((st, *gk, None) for st, gk in wanted.items()))
                    continue
                for s, e in failed.items():
                    log.warning("store %s generation %d not applied (tried again): %s", s, wanted[s][0], e)
                if failed:
                    nursery.start_soon(retry.later, *((st, *wanted[st], None) for st in failed))
                else:
                    retry.succeeded()
                if changes is None:
                    continue
                await told(changes)
                log.info("merged %s (%d inodes, %d entries changed) in %.3f s (%s)",
                         ", ".join(f"store {s} generation {gk[0]}" for s, gk in sorted(wanted.items()) if s not in failed),
                         len(changes.inos), len(changes.entries), trio.current_time() - started,
                         ", ".join(f"{part} {sec:.3f} s" for part, sec in source.step_seconds.items()))
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(close_all, list(listeners.values()))
