"""A producer's generations as a Lamport clock across the stores of its prefix (docs/design.md
section 17, "One namespace for a job"): the daemon listens to the notices of every other
store under its remote's prefix and moves its own generation counter past each generation
they name (`Store.observe_generation`), so a change made here after another store's change
was seen here has the higher generation. The merged view's clash rule (remote/merge.py)
compares those generations: the later commit wins, and no machine's clock decides.

Peers are found by listing `stores/` every PEER_LOOK seconds; a peer whose notices do not
arrive (no `--notify`, or its daemon down) is looked at in the bucket (its newest catalog
object's generation) at the same interval. A store alone under its prefix looks less and
less often (`next_look`: the interval doubles up to PEER_LOOK_ALONE): a store that appears
looks at this one at once, so only this store's ordering after the newcomer's first
commits waits for the next look.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio

from ..errors import CowfsError
from .operations import CowfsOperations
from .remote_uploads import remote_set

if TYPE_CHECKING:
    from ..remote.notices import NoticeListener

log = logging.getLogger("cowfs.remote")
PEER_LOOK = 3.0  # seconds between listings of the prefix's stores
PEER_LOOK_ALONE = 48.0  # at most this long between them while no other store is there


def next_look(previous: float, peers: int) -> float:
    """Seconds until the next listing: PEER_LOOK while there are peers, else twice the last
    interval, up to PEER_LOOK_ALONE."""
    return PEER_LOOK if peers else min(previous * 2, PEER_LOOK_ALONE)


async def follow_peer_clocks(ops: CowfsOperations) -> None:
    store = ops.store
    if not await remote_set(ops):
        return

    def modules() -> tuple:  # type: ignore[type-arg]
        from ..remote.catalogs import retained_catalogs
        from ..remote.notices import NoticeListener, close_all
        from ..remote.tier import tier_of
        return retained_catalogs, NoticeListener, close_all, tier_of

    retained_catalogs, notice_listener, close_all, tier_of = await trio.to_thread.run_sync(modules)
    tier = tier_of(store)
    own = store.config.store_uuid
    listeners: dict[str, NoticeListener] = {}
    url = None

    def observe(gen: int) -> None:  # (a listener's thread)
        try:
            if not store.closed:
                store.observe_generation(gen)
        except CowfsError as e:
            log.warning("a peer's generation %d not observed: %s", gen, e)

    def look() -> int:
        """Returns how many peers there are."""
        nonlocal url
        cfg = tier.config
        if cfg is None or cfg.url != url:
            close_all(list(listeners.values()))
            listeners.clear()
            url = None if cfg is None else cfg.url
        if cfg is None:
            return 0
        bucket = tier.bucket()
        peers = [u for u in bucket.subfolders(bucket.key("stores", "")) if u != own]
        for peer in peers:
            listener = listeners.get(peer)
            if listener is None:
                listener = listeners[peer] = notice_listener(bucket, peer, lambda notice: observe(notice.generation))
            if not listener.connected.is_set():
                objects = retained_catalogs(bucket, peer)
                if objects:
                    observe(objects[-1].generation)
        return len(peers)

    try:
        delay = PEER_LOOK / 2
        while not ops.handles.unmounting:
            try:
                delay = next_look(delay, await trio.to_thread.run_sync(look))
            except CowfsError as e:
                log.info("the prefix's other stores not looked at: %s", e)
                delay = PEER_LOOK
            await trio.sleep(delay)
    finally:
        with trio.CancelScope(shield=True):  # the listeners' threads end before the store closes
            await trio.to_thread.run_sync(close_all, list(listeners.values()))
