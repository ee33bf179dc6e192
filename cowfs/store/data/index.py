"""Chunk index for writers: dedup lookups and pins on chunks not yet committed.

A write session pins every chunk it will reference before it checks the
catalog, and gc decides and deletes dead chunks while holding `gc_lock` alone
(writers share it: gc_lock.py), so a chunk a session found in the catalog cannot
be deleted before the session commits, and a chunk appended but not yet committed
is never punched.
"""
from __future__ import annotations

import threading

from ..catalog.db import Catalog
from ..log.log import LOCATION_COLS, Location, location
from .gc_lock import GcLock


class InflightChunk:
    """A chunk pinned by write sessions, and where records of it were appended. A plain
    slotted class: one is made per new chunk with the GIL held (a dataclass with a default
    factory costs several times as much)."""

    __slots__ = ("pins", "locations")

    def __init__(self) -> None:
        self.pins = 0
        self.locations: list[Location] = []


class ChunkIndex:
    def __init__(self, catalog: Catalog) -> None:
        self._catalog = catalog
        self.gc_lock = GcLock()
        self._lock = threading.Lock()
        self._inflight: dict[bytes, InflightChunk] = {}

    def pin(self, hashes: list[bytes]) -> dict[bytes, Location]:
        """Pin `hashes`; return the known location of each that is already stored or in flight."""
        known: dict[bytes, Location] = {}
        with self.gc_lock.shared(), self._lock:
            for h in hashes:
                entry = self._inflight.get(h)
                if entry is None:
                    entry = self._inflight[h] = InflightChunk()
                entry.pins += 1
                if entry.locations:
                    known[h] = entry.locations[0]
        missing = [h for h in set(hashes) if h not in known]
        if missing:
            conn = self._catalog.reader()
            for i in range(0, len(missing), 500):
                part = missing[i:i + 500]
                q = f"SELECT hash, {LOCATION_COLS} FROM chunks WHERE hash IN (%s)" % ",".join("?" * len(part))
                for h, *loc in conn.execute(q, part):
                    known[bytes(h)] = location(*loc)
        return known

    def add_locations(self, located: list[tuple[bytes, Location]]) -> None:
        """Record where each (hash, location) was appended, under one lock."""
        with self._lock:
            inflight = self._inflight
            for h, loc in located:
                entry = inflight.get(h)
                if entry is None:
                    entry = inflight[h] = InflightChunk()
                entry.locations.append(loc)

    def unpin(self, hashes: list[bytes]) -> None:
        with self._lock:
            for h in hashes:
                entry = self._inflight.get(h)
                if entry is None:
                    continue
                entry.pins -= 1
                if entry.pins <= 0:
                    del self._inflight[h]

    def protected(self) -> tuple[set[bytes], set[tuple[int, int]]]:
        """Hashes pinned and record locations in flight; call with gc_lock held alone."""
        with self._lock:
            hashes = set(self._inflight)
            locs = {(loc.seg_id, loc.offset) for e in self._inflight.values() for loc in e.locations}
        return hashes, locs
