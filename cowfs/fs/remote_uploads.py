"""The daemon's uploader: after each committed change, the store's new chunks and catalog go
to its bucket (remote/upload.py) from a worker thread, off the write path.

A commit only wakes this task (a store subscriber hands a flag to the trio loop); a pass
uploads everything committed by the time it copies the catalog, so changes made during a
pass are taken by the next one. Failures (network down, engine refusing) are logged and
retried with backoff; nothing is lost meanwhile, since the local log holds every version.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio

from ..errors import CowfsError
from ..remote.config import REMOTE_FILE
from ..store.catalog.events import Event
from .operations import CowfsOperations

if TYPE_CHECKING:
    from ..remote.notices import Inline, NoticeServer

log = logging.getLogger("cowfs.remote")
CONFIG_CHECK = 1.0  # seconds between looks for a remote set while mounted
CATCH_UP = 10.0  # seconds between looks at the generation when no event came
RETRY_FIRST = 1.0
RETRY_MAX = 60.0
PUSHED_LOG = "uploaded generation %d: %d chunks in %d packs (%d bytes), catalog %d bytes, in %.2fs"


def _remote_modules() -> tuple:  # type: ignore[type-arg]
    from ..remote.notices import NoticeServer
    from ..remote.tier import tier_of

    return NoticeServer, tier_of


async def remote_set(ops: CowfsOperations) -> bool:
    """Wait until the store has a remote (boto3 costs ~0.2 s of CPU to import: only then);
    False if the mount ends first."""
    while not (ops.store.root / REMOTE_FILE).exists():
        if ops.handles.unmounting:
            return False
        await trio.sleep(CONFIG_CHECK)
    return True


async def upload_in_background(ops: CowfsOperations) -> None:
    store = ops.store
    if not await remote_set(ops):
        return
    notice_server, tier_of = await trio.to_thread.run_sync(_remote_modules)
    tier = tier_of(store)
    token = trio.lowlevel.current_trio_token()
    wake = trio.Event()
    dirty = True  # what an earlier run left unpushed is pushed first

    def changed() -> None:
        nonlocal dirty
        dirty = True
        wake.set()

    def deliver(_event: Event) -> None:
        try:
            token.run_sync_soon(changed)
        except trio.RunFinishedError:
            pass

    unsubscribe = None
    server: NoticeServer | None = None
    refused: str | None = None  # a notice address that could not be listened on
    retry = 0.0
    pushed_gen = -1
    try:
        while not ops.handles.unmounting:
            cfg = tier.config
            if server is not None and (cfg is None or cfg.notify != server.configured):
                server.close()
                server = None
            if cfg is None:
                if unsubscribe is not None:
                    unsubscribe()
                    unsubscribe = None
                dirty = True
                await trio.sleep(CONFIG_CHECK)
                continue
            if unsubscribe is None:
                unsubscribe = store.events.subscribe(deliver)
            if server is None and cfg.notify is not None and cfg.notify != refused:
                try:
                    server = notice_server(cfg.notify, tier.bucket(), store.config.store_uuid)
                except (OSError, CowfsError) as e:  # said once: tried again when the address changes
                    log.warning("no notices to consumers: cannot listen on %s (%s)", cfg.notify, e)
                    refused = cfg.notify
            if not dirty:
                # changes that publish no event (mkdir, chmod, xattrs) are caught by a look at
                # the generation now and then, from a worker thread
                with trio.move_on_after(CATCH_UP):
                    await wake.wait()
                if not dirty and await trio.to_thread.run_sync(lambda: store.generation) == pushed_gen:
                    continue
            wake = trio.Event()
            dirty = False

            def tell(generation: int, key: str, inline: Inline, server: NoticeServer | None = server) -> None:
                # from the upload thread, once the pass's first catalog object is in: before
                # a whole catalog is made and uploaded, which may take seconds on a large store
                if server is None:
                    return
                try:
                    trio.from_thread.run(_notify, server, generation, key, inline, trio_token=token)
                except (Exception, trio.Cancelled):  # noqa: BLE001 - unmounting, or a notice lost: the pass goes on
                    log.warning("notice of generation %d not sent", generation, exc_info=True)

            try:
                report = await trio.to_thread.run_sync(
                    lambda: tier.push(stop=lambda: ops.handles.unmounting, background=True, on_catalog=tell))
            except CowfsError as e:
                dirty = True
                retry = min(max(retry * 2, RETRY_FIRST), RETRY_MAX)
                log.warning("upload failed (retrying in %.0f s): %s", retry, e)
                await trio.sleep(retry)
                continue
            except Exception:  # noqa: BLE001 - the daemon goes on serving; it tries again later
                log.exception("upload failed")
                dirty = True
                await trio.sleep(RETRY_MAX)
                continue
            retry = 0.0
            pushed_gen = report.generation
            if not report.skipped:
                log.info(PUSHED_LOG, report.generation, report.chunks, report.packs, report.bytes,
                         report.catalog_bytes, report.seconds)
            if server is not None and report.catalog_key and not report.told:  # nothing new: the newest again
                await _notify(server, report.generation, report.catalog_key)
    finally:
        if unsubscribe is not None:
            unsubscribe()
        if server is not None:
            server.close()


async def _notify(server: NoticeServer, generation: int, key: str, inline: Inline | None = None) -> None:
    """Tell the consumers; the first time, first say in the bucket where to listen."""
    if not server.published:
        try:
            await trio.to_thread.run_sync(server.publish_address)
            log.info("notices of new versions from %s", server.address)
        except CowfsError as e:
            log.warning("notices: writing the address to the bucket failed (tried again later): %s", e)
    await trio.to_thread.run_sync(server.notify, generation, key, inline)
