"""`cowfs mount s3://BUCKET/PREFIX MOUNTPOINT --read-only --cache DIR`: a consumer's mount of a
store kept in a bucket, read-only, following the producer's new versions as its notices
arrive (remote/notices.py), without polling the bucket. A producer that sends none (its
remote set without --notify, or its daemon down: no notice connection for QUIET_SECONDS) is
followed by a look at the bucket every POLL_SECONDS instead, said once in the log, as
--all-stores does for such stores (union_follow.py).

On a notice of generation G the daemon brings its catalog file to G (a worker thread: the
delta applied in place, or a new file from a whole catalog, swapped in), tells the kernel
which entries and inodes changed, and publishes the changes to `cowfs watch` subscribers,
all found from the rows the deltas changed (remote/changes.py). The mount is made with the
kernel's `ro` flag, so writes fail with EROFS before they reach the daemon; control
requests that would change the store fail with EROFS too (the replica raises ReadOnly).
"""
from __future__ import annotations

import logging
import math
import os
import signal
from functools import partial
from pathlib import Path

import pyfuse3
import trio

from ..errors import CowfsError
from ..mountinfo import FSNAME_PREFIX
from ..remote.config import RemoteConfig
from ..remote.merge import NAMESPACE_UUID
from ..remote.consumer_bucket import STALE_SECONDS
from ..remote.notices import Inline, Notice, NoticeListener
from ..remote.replica import Replica
from ..remote.source import ReplicaSource
from ..remote.union_source import UnionSource
from ..store.catalog.db import Catalog
from .heap import keep_freed_memory
from ..store.log.layout import DEFAULT_SEGMENT_SIZE, StoreConfig, take_lock
from .mount import LOG_FILE, SNAPSHOT_ON_CHECKPOINT, MountError, _setup_logging, go_live, start_daemon
from .operations import CowfsOperations
from .replica_changes import Retry, tell
from .union_follow import POLL_SECONDS, QuietStores, follow_union
from .union_snapshots import union_checkpoint_snapshots

log = logging.getLogger("cowfs.replica")
DEFAULT_CACHE_SIZE = 10 << 30


async def follow(ops: CowfsOperations, source: ReplicaSource, gen: int) -> None:
    """Apply each notice of a newer generation, oldest first; stale ones are skipped, failed
    ones tried again (replica_changes.Retry)."""
    replica: Replica = ops.store  # type: ignore[assignment]
    send, recv = trio.open_memory_channel[tuple[int, str, Inline | None]](math.inf)
    token = trio.lowlevel.current_trio_token()

    def on_notice(notice: Notice) -> None:
        try:
            token.run_sync_soon(send.send_nowait, (notice.generation, notice.key, notice.inline))
        except trio.RunFinishedError:
            pass

    async def learn_later() -> None:  # packs a remote gc deleted forgotten, after steps applied from notices alone
        while True:
            await trio.sleep(STALE_SECONDS)
            try:
                await trio.to_thread.run_sync(source.shared.learn_if_stale)
            except CowfsError as e:  # the bucket unreachable: the next look tries again
                log.warning("the bucket's pack indexes not looked at (tried again): %s", e)

    async def look_while_quiet() -> None:  # a producer that sends no notices: its newest catalog, by a look
        quiet = QuietStores()
        quiet.listening(source.store_uuid, trio.current_time())
        while True:
            await trio.sleep(POLL_SECONDS)
            if not quiet.should_look(source.store_uuid, listener.connected.is_set(), trio.current_time()):
                continue
            try:
                g, key = await trio.to_thread.run_sync(source.newest)
            except CowfsError as e:  # the bucket unreachable: the next look tries again
                log.warning("the bucket not looked at (tried again): %s", e)
                continue
            send.send_nowait((g, key, None))  # (a generation not newer than the one served is skipped)

    listener = NoticeListener(source.bucket, source.store_uuid, on_notice)
    retry = Retry(send)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(learn_later)
            nursery.start_soon(look_while_quiet)
            async for g, key, inline in recv:
                if g <= gen:
                    continue
                try:
                    await _apply(replica, source, gen, g, key, inline)
                except Exception as e:  # noqa: BLE001 - the mount goes on serving what it has, and tries again
                    log.warning("generation %d not applied (tried again): %s", g, e,
                                exc_info=not isinstance(e, CowfsError))
                    nursery.start_soon(retry.later, (g, key, None))
                    continue
                retry.succeeded()
                gen = g
    finally:
        await trio.to_thread.run_sync(listener.close)


async def _apply(replica: Replica, source: ReplicaSource, gen: int, g: int, key: str, inline: Inline | None) -> None:
    """Fetch generation g (from what its notice carried, if anything), serve it, drop what
    the kernel caches of what changed since gen."""
    fetched = await trio.to_thread.run_sync(lambda: source.fetch_catalog(g, key, inline=inline))
    changes = fetched.changes
    if fetched.path != replica.catalog.path:  # a new file (from a whole catalog): swap it in
        catalog = await trio.to_thread.run_sync(Catalog, fetched.path)
        for done in replica.use_catalog(catalog):
            await trio.to_thread.run_sync(done.close)
    await tell(replica, changes)
    log.info("generation %d applied (%d inodes, %d entries changed)", g, len(changes.inos), len(changes.entries))
    if fetched.new_file:
        await trio.to_thread.run_sync(source.drop_catalogs, {fetched.path, *replica.catalog_paths()}, True)


async def _serve(ops: CowfsOperations, source: ReplicaSource | UnionSource, gen: int, ready_fd: int | None,
                 mountpoint: Path, snapshot_on: str | None = None) -> None:
    async with trio.open_nursery() as nursery:
        async def on_signals() -> None:
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for sig in signals:
                    log.info("signal %d: unmounting", sig)
                    pyfuse3.terminate()
                    return

        nursery.start_soon(on_signals)
        await go_live(nursery, ops, mountpoint, ready_fd)
        if isinstance(source, UnionSource):
            if snapshot_on == SNAPSHOT_ON_CHECKPOINT:  # subscribed before the first step is merged
                await nursery.start(union_checkpoint_snapshots, ops.store)
            nursery.start_soon(follow_union, source, partial(tell, ops.store))
        else:
            nursery.start_soon(follow, ops, source, gen)
        await pyfuse3.main()
        nursery.cancel_scope.cancel()


# a consumer's daemon: each fetched 4 MiB block is a new `bytes`; with its freed memory kept,
# cold reads through a consumer ran about 10% faster (page faults and zeroing had been 8% of
# its CPU), for about 50 MiB more resident memory (docs/benchmarks.md, remote tier,
# thirteenth round)
KEEP_FREED = 512 << 20
HEAP_BELOW = 64 << 20


def _open_source(cache: Path, cfg: RemoteConfig, store_uuid: str | None,
                 all_stores: bool) -> tuple[ReplicaSource | UnionSource, Path, int]:
    """The source to follow, the catalog file the replica serves and its generation (for
    every store: the merged catalog of the stores listed now, each at its newest; stores
    that appear later come in through follow_union)."""
    if all_stores:
        union = UnionSource(cache, cfg)
        try:
            union.catch_up()
        except BaseException:
            union.close()
            raise
        return union, union.path, union.merged.generation
    source = ReplicaSource(cache, cfg, store_uuid)
    try:
        gen, key = source.newest()
        path = source.fetch_catalog(gen, key).path
        source.drop_catalogs({path}, every_store=True)  # nothing else is open yet: files of earlier generations go
    except BaseException:
        source.close()
        raise
    return source, path, gen


def run_replica_daemon(cfg: RemoteConfig, store_uuid: str | None, cache: Path, mountpoint: Path, *,
                       foreground: bool, allow_other: bool, cache_size: int, ready_fd: int | None = None,
                       debug: bool = False, all_stores: bool = False, snapshot_on: str | None = None) -> int:
    keep_freed_memory(HEAP_BELOW, KEEP_FREED)
    cache.mkdir(parents=True, exist_ok=True)
    lock_fd = take_lock(cache, "cache")
    try:
        _setup_logging(cache, foreground, debug)
        source, path, gen = _open_source(cache, cfg, store_uuid, all_stores)
        try:
            what = "every store" if isinstance(source, UnionSource) else f"store {source.store_uuid}"
            config = StoreConfig(store_uuid=NAMESPACE_UUID if isinstance(source, UnionSource) else source.store_uuid,
                                 device="file", segment_size=DEFAULT_SEGMENT_SIZE)
            replica = Replica(cache, config, path, source, cache_size)
            try:
                ops = CowfsOperations(replica)
                options = set(pyfuse3.default_options) | {"ro", "subtype=cowfs"}
                options.add(f"fsname={FSNAME_PREFIX}{cache}".replace("\\", "\\\\").replace(",", "\\,"))
                if allow_other:
                    options.add("allow_other")
                pyfuse3.init(ops, str(mountpoint), options)
                log.info("mounted %s (%s, generation %d) on %s, read-only (pid %d)", cfg.url, what, gen, mountpoint,
                         os.getpid())
                try:
                    trio.run(_serve, ops, source, gen, ready_fd, mountpoint, snapshot_on)
                finally:
                    pyfuse3.close(unmount=True)
                    log.info("unmounted %s", mountpoint)
            finally:
                replica.close()
        finally:
            source.close()
    finally:
        os.ftruncate(lock_fd, 0)
        os.close(lock_fd)
    return 0


def mount_replica(url: str, mountpoint: str, *, cache: str | None, endpoint: str | None = None,
                  region: str | None = None, credentials_file: str | None = None, profile: str | None = None,
                  store_uuid: str | None = None, all_stores: bool = False, foreground: bool = False,
                  allow_other: bool = False,
                  cache_size: int = DEFAULT_CACHE_SIZE, debug: bool = False, snapshot_on: str | None = None) -> int:
    if cache is None:
        raise MountError(f"{url}: a remote mount needs --cache DIR (a local directory for its catalog and blocks)")
    if snapshot_on is not None and snapshot_on != SNAPSHOT_ON_CHECKPOINT:
        raise MountError(f"--snapshot-on: unknown {snapshot_on!r} (only {SNAPSHOT_ON_CHECKPOINT!r})")
    if snapshot_on is not None and not all_stores:
        raise MountError("--snapshot-on: a consumer of one store shows its producer's snapshots and takes none; "
                         "a consumer of every store (--all-stores) pins its own in the bucket")
    cfg = RemoteConfig(url=url, endpoint=endpoint, region=region, credentials_file=credentials_file, profile=profile)
    cfg.address  # noqa: B018 (a bad URL raises here)
    mnt = Path(mountpoint).absolute()
    cache_dir = Path(cache).absolute()
    if not Path("/dev/fuse").exists():
        raise MountError("/dev/fuse does not exist: FUSE is not available on this machine")
    if not mnt.is_dir():
        raise MountError(f"{mnt}: mountpoint does not exist or is not a directory")
    if os.path.ismount(mnt) or any(mnt.iterdir()):
        raise MountError(f"{mnt}: something is already mounted there, or it is not empty")
    if cache_dir.exists() and not cache_dir.is_dir():
        raise MountError(f"{cache_dir}: the cache must be a directory")

    def run(ready_fd: int | None) -> object:
        return run_replica_daemon(cfg, store_uuid, cache_dir, mnt, foreground=ready_fd is None,
                                  allow_other=allow_other, cache_size=cache_size, ready_fd=ready_fd, debug=debug,
                                  all_stores=all_stores, snapshot_on=snapshot_on)

    what = ", every store" if all_stores else ""
    what += ", snapshots pinned on checkpoint" if snapshot_on else ""
    return start_daemon(run, foreground, f"{url}{what} on {mnt}, read-only, cache {cache_dir}")


__all__ = ["mount_replica", "run_replica_daemon", "LOG_FILE"]
