"""Reads of a producer's evicted segments: ranged GETs of the packs their maps name, through
the same block cache a consumer uses (replica.BlockCache), kept in `STORE/cache/blocks/`.
The engine checks every record read this way as it checks one from a segment file."""
from __future__ import annotations

from pathlib import Path

from ..errors import RemoteError
from .config import read_remote_config
from .replica import BlockCache, PackSegment
from .s3 import Bucket

DEFAULT_FETCH_CACHE = 1 << 30
CACHE_DIR = "cache"


class BucketPackReader:
    """The `store.evicted.PackReader` of a store with a remote."""

    def __init__(self, root: Path) -> None:
        cfg = read_remote_config(root)
        if cfg is None:
            raise RemoteError(f"{root}: no remote set, so its evicted segments cannot be read "
                              "(cowfs remote set it to the bucket they were evicted to)")
        self.cache = BlockCache(root / CACHE_DIR / "blocks", Bucket(cfg), cfg.fetch_cache or DEFAULT_FETCH_CACHE)

    def read_into(self, pack: str, size: int, offset: int, buffers: list[memoryview]) -> int:
        return PackSegment(pack, size, self.cache).read_into(offset, buffers)

    def will_need(self, pack: str, size: int, offset: int, length: int) -> None:
        PackSegment(pack, size, self.cache).will_need(offset, length)

    def close(self) -> None:
        self.cache.close()


def bucket_pack_reader(root: Path) -> BucketPackReader:
    return BucketPackReader(root)
