"""`ChunkWriter`: a write session's chunks pinned, deduplicated and appended to the log."""
from __future__ import annotations

from itertools import accumulate

from ... import _native
from ..log.log import Location, Log
from ..log.records import record_span
from .chunking import CutBatch
from .content import Extent
from .index import ChunkIndex


class ChunkWriter:
    """Pin, dedup and append a session's cut chunks (their ids come with the cut); remember
    where each lives for read-back and commit."""

    def __init__(self, log: Log, index: ChunkIndex) -> None:
        self._log = log
        self._index = index
        self.pins: list[bytes] = []
        self.locations: dict[bytes, Location] = {}
        self.new_bytes = 0

    def store(self, batch: CutBatch, threads: int = 1) -> list[Extent]:
        """The batch's chunks as extents: pinned, and those no record holds yet (known to
        neither the index nor this session) staged as records in one native call (on
        `threads` threads) and appended in one write per segment."""
        n = len(batch)
        if not n:
            return []
        hashes = batch.hashes()
        sizes = batch.sizes()
        known = self._index.pin(hashes)
        self.pins.extend(hashes)
        locations = self.locations
        for h, loc in known.items():
            locations.setdefault(h, loc)
        picks = bytearray(n)
        todo: list[int] = []
        queued: set[bytes] = set()
        for i, h in enumerate(hashes):
            if h not in locations and h not in queued:
                picks[i] = 1
                todo.append(i)
                queued.add(h)
        if todo:
            new_sizes = [sizes[i] for i in todo]
            with self._log.staging(sum(record_span(n) for n in new_sizes)) as staged:
                _native.stage_records(batch.pieces, batch.lengths, batch.ids, picks, threads, staged)
                # append and register under gc_lock (shared with the other writers; gc takes it alone):
                # gc never sees a record that is written but not yet known
                with self._index.gc_lock.shared():
                    located = list(zip([hashes[i] for i in todo], self._log.append_staged(staged, new_sizes)))
                    self._index.add_locations(located)
            locations.update(located)
            self.new_bytes += sum(new_sizes)
        offsets = accumulate(sizes[:-1], initial=batch.start)
        return [Extent(off, size, h, locations[h]) for off, size, h in zip(offsets, sizes, hashes)]

    def release(self) -> None:
        self._index.unpin(self.pins)
        self.pins = []
        self.locations = {}
        self.new_bytes = 0
