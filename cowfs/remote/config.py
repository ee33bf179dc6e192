"""Where a store's remote tier is: `STORE/remote.json` and the `s3://BUCKET/PREFIX` address.

The file names the bucket, the prefix, the endpoint and where credentials come from (the
AWS environment variables, or a credentials file outside the store); it never holds a key.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import InvalidArgument, RemoteError
from ..store.log.layout import fsync_dir, write_durably

REMOTE_FILE = "remote.json"
REMOTE_STATE_FILE = "remote.db"
FORMAT_NAME = "cowfs-remote"
MIN_FETCH_CACHE = 16 << 20
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")


@dataclass(frozen=True)
class RemoteAddress:
    bucket: str
    prefix: str  # no leading or trailing "/"; may be empty

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    def key(self, *parts: str) -> str:
        return "/".join([self.prefix, *parts]) if self.prefix else "/".join(parts)


def parse_url(url: str) -> RemoteAddress:
    """`s3://BUCKET[/PREFIX]` to its parts (InvalidArgument with the reason otherwise)."""
    if not url.startswith("s3://"):
        raise InvalidArgument(f"{url}: a remote is written s3://BUCKET/PREFIX")
    bucket, _, prefix = url[len("s3://"):].partition("/")
    prefix = prefix.strip("/")
    if not _BUCKET.match(bucket) or ".." in bucket:
        raise InvalidArgument(f"{url}: {bucket!r} is not a valid bucket name (3-63 of a-z 0-9 . -)")
    if "//" in prefix or any(p in (".", "..") for p in prefix.split("/")):
        raise InvalidArgument(f"{url}: the prefix has an empty, '.' or '..' part")
    return RemoteAddress(bucket, prefix)


def parse_address(text: str) -> tuple[str, int]:
    """HOST:PORT (an IPv6 host in brackets) to its parts."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise InvalidArgument(f"{text}: give the address for notices as HOST:PORT (PORT 0: any free port)")
    return host.strip("[]"), int(port)


@dataclass(frozen=True)
class RemoteConfig:
    url: str
    endpoint: str | None = None  # None: the AWS default for the region
    region: str | None = None
    credentials_file: str | None = None  # an AWS credentials file (ini) outside the store
    profile: str | None = None  # its section; None: "default"
    notify: str | None = None  # HOST:PORT the producer's daemon sends notices of new versions from (notices.py)
    local_limit: int | None = None  # bytes of segment files kept locally; beyond, segments in the bucket are evicted
    fetch_cache: int | None = None  # bytes of fetched pack blocks kept in STORE/cache (None: 1 GiB)

    @property
    def address(self) -> RemoteAddress:
        return parse_url(self.url)

    def to_json(self) -> str:
        data = {"format": FORMAT_NAME, "version": 1, **asdict(self)}
        return json.dumps(data, indent=2) + "\n"


def check_config(cfg: RemoteConfig, store_root: Path | None = None) -> None:
    cfg.address  # noqa: B018 (raises on a bad url)
    if cfg.endpoint is not None and not re.match(r"^https?://[^/\s]+(/.*)?$", cfg.endpoint):
        raise InvalidArgument(f"{cfg.endpoint}: the endpoint is an http:// or https:// URL")
    if cfg.credentials_file is not None:
        path = Path(cfg.credentials_file)
        if not path.is_absolute():
            raise InvalidArgument(f"{path}: give the credentials file as an absolute path")
        if store_root is not None and path.resolve().is_relative_to(store_root.resolve()):
            raise InvalidArgument(f"{path}: keep the credentials file outside the store")
        if not path.is_file():
            raise InvalidArgument(f"{path}: no such credentials file")
    if cfg.notify is not None:
        parse_address(cfg.notify)
    if cfg.local_limit is not None and cfg.local_limit < 0:
        raise InvalidArgument(f"local limit {cfg.local_limit}: give a size (0: keep only the newest segment)")
    if cfg.fetch_cache is not None and cfg.fetch_cache < MIN_FETCH_CACHE:
        raise InvalidArgument(f"fetch cache {cfg.fetch_cache}: give at least {MIN_FETCH_CACHE >> 20} MiB")


def write_remote_config(root: Path, cfg: RemoteConfig) -> None:
    check_config(cfg, root)
    write_durably(root / REMOTE_FILE, cfg.to_json())


def read_remote_config(root: Path) -> RemoteConfig | None:
    """The store's remote, or None when it has none."""
    path = root / REMOTE_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise RemoteError(f"{path}: unreadable remote config ({e})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT_NAME or data.get("version") != 1:
        raise RemoteError(f"{path}: not a cowfs remote config (version 1)")
    try:
        cfg = RemoteConfig(url=str(data["url"]), endpoint=data.get("endpoint"), region=data.get("region"),
                           credentials_file=data.get("credentials_file"), profile=data.get("profile"),
                           notify=data.get("notify"), local_limit=_size_or_none(data, "local_limit", path),
                           fetch_cache=_size_or_none(data, "fetch_cache", path))
    except KeyError as e:
        raise RemoteError(f"{path}: remote config is missing {e}") from None
    cfg.address  # noqa: B018
    return cfg


def _size_or_none(data: dict, key: str, path: Path) -> int | None:  # type: ignore[type-arg]
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise RemoteError(f"{path}: {key} is not a byte count")
    return value


def remove_remote_config(root: Path) -> bool:
    try:
        os.unlink(root / REMOTE_FILE)
    except FileNotFoundError:
        return False
    fsync_dir(root)
    return True
