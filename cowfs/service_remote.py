"""The `cowfs remote` requests, as functions of a Store (the CLI and the daemon share them)."""
from __future__ import annotations

from typing import Any, Callable

from .remote.config import RemoteConfig
from .remote.tier import tier_of
from .store import Store


def remote_set(store: Store, url: str, endpoint: str | None = None, region: str | None = None,
               credentials_file: str | None = None, profile: str | None = None,
               create_bucket: bool = False, notify: str | None = None) -> dict[str, Any]:
    cfg = RemoteConfig(url=url, endpoint=endpoint, region=region, credentials_file=credentials_file, profile=profile,
                       notify=notify)
    made = tier_of(store).set(cfg, create_bucket=create_bucket)
    return {"remote": cfg.url, "endpoint": endpoint, "bucket_created": made}


def remote_unset(store: Store) -> dict[str, Any]:
    return {"removed": tier_of(store).unset()}


def remote_status(store: Store) -> dict[str, Any]:
    return tier_of(store).status()


def remote_push(store: Store, progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    return tier_of(store).push(progress=progress).to_json()


OPS: dict[str, Callable[..., Any]] = {
    "remote_set": remote_set,
    "remote_unset": remote_unset,
    "remote_status": remote_status,
    "remote_push": remote_push,
}
