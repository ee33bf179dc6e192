"""The parts of the engine that the operations below `Store` are given.

gc, fsck, eviction and the compactor work on the engine's parts (the catalog, the log, the
dedup index, the holds), not on `Store`: each names what it uses by a Protocol here, and
`Store` (which has them all) is passed as is. So store.py imports the operations and the
operations import only this module and the packages below: the arrows point one way.
"""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Callable, Protocol

from .catalog.db import Catalog
from .data.content import Extent, VersionId
from .data.holds import Holds
from .data.index import ChunkIndex
from .data.reader import FileReader
from .log.layout import StoreConfig
from .log.log import Log


class EngineParts(Protocol):
    """What every operation below `Store` reads and changes."""

    @property
    def root(self) -> Path: ...
    @property
    def config(self) -> StoreConfig: ...
    @property
    def catalog(self) -> Catalog: ...
    @property
    def log(self) -> Log: ...
    @property
    def index(self) -> ChunkIndex: ...
    @property
    def holds(self) -> Holds: ...


class Collecting(EngineParts, Protocol):
    """gc (upkeep/gc.py): also the store's size on disk, for its report."""

    def physical_bytes(self) -> int: ...


class Checking(EngineParts, Protocol):
    """fsck (upkeep/fsck.py): also puts a rebuilt catalog in place of the damaged one."""

    def replace_catalog(self, new: Path) -> None: ...


class Evicting(EngineParts, Protocol):
    """Eviction (upkeep/evict.py): also the lock that keeps gc and fsck away meanwhile."""

    @property
    def maintenance(self) -> threading.Lock: ...


class BodyReading(EngineParts, Protocol):
    """The compactor (tensors/): also readers of the bodies it re-encodes."""

    def body_reader(self, extents: list[Extent], size: int, on_close: Callable[[], None] | None = None,
                    version: VersionId | None = None) -> FileReader: ...
