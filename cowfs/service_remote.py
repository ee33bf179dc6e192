"""The `cowfs remote` requests, as functions of a Store (the CLI and the daemon share them).

The remote modules (boto3 among them) are imported by the first request that needs them,
so every other `cowfs` command starts as fast as before (boto3 costs ~0.1 s of CPU)."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from .units import parse_duration

if TYPE_CHECKING:
    from .remote.tier import RemoteTier
    from .store import Store
    from .store.log.evicted import PackReader


def _tier(store: "Store") -> "RemoteTier":
    from .remote.tier import tier_of

    return tier_of(store)


def remote_set(store: "Store", url: str, endpoint: str | None = None, region: str | None = None,
               credentials_file: str | None = None, profile: str | None = None,
               create_bucket: bool = False, notify: str | None = None, local_limit: int | None = None,
               fetch_cache: int | None = None) -> dict[str, Any]:
    from .remote.config import RemoteConfig

    cfg = RemoteConfig(url=url, endpoint=endpoint, region=region, credentials_file=credentials_file, profile=profile,
                       notify=notify, local_limit=local_limit, fetch_cache=fetch_cache)
    made = _tier(store).set(cfg, create_bucket=create_bucket)
    return {"remote": cfg.url, "endpoint": endpoint, "bucket_created": made}


def remote_unset(store: "Store") -> dict[str, Any]:
    return {"removed": _tier(store).unset()}


def remote_status(store: "Store") -> dict[str, Any]:
    return _tier(store).status()


def remote_push(store: "Store", progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    return _tier(store).push(progress=progress).to_json()


def remote_fetch(store: "Store", progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    return _tier(store).fetch_back(progress=progress)


def pack_reader(root: Path) -> "PackReader":
    """The reader of a store's evicted segments (Store.open's `pack_reader`): boto3 and the
    remote modules are imported only when a store first reads an evicted segment."""
    from .remote.evicted_reads import bucket_pack_reader

    return bucket_pack_reader(root)


def remote_gc(store: "Store", grace: str | None = None,
              progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """`grace`: a duration (units.parse_duration); None: the default, 1 hour."""
    seconds = parse_duration(grace) if grace is not None else None  # bad input first, before any bucket
    from .remote.gc import DEFAULT_GRACE, check_grace

    seconds = DEFAULT_GRACE if seconds is None else seconds
    check_grace(seconds)
    return _tier(store).gc(seconds, progress=progress)


def remote_fsck(store: "Store", deep: bool = False, progress: Callable[[int, int], None] | None = None
                ) -> dict[str, Any]:
    return _tier(store).fsck(deep, progress=progress)


OPS: dict[str, Callable[..., Any]] = {
    "remote_set": remote_set,
    "remote_unset": remote_unset,
    "remote_status": remote_status,
    "remote_push": remote_push,
    "remote_fetch": remote_fetch,
    "remote_gc": remote_gc,
    "remote_fsck": remote_fsck,
}
