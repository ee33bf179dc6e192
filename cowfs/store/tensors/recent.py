"""The raw bytes of the pieces a compaction run handled last, and which delta codec won
for each tensor: what the next older body's pieces are encoded against (compact_body.py)."""
from __future__ import annotations

from collections import OrderedDict

from ..log.codecs import BLOSC_ONLY, FDELTA_FIRST, FDELTA_LANES, FDELTA_ONLY, Encoded

RECENT_BYTES = 256 << 20  # raw bytes of recently handled pieces kept for the next older body


class RecentPieces:
    """The raw bytes of the piece the run handled last for each (tensor key, piece), at most
    RECENT_BYTES (oldest dropped first): the next older body's piece is encoded against them
    without reading them back from the log (a delta would be decoded through its chain).
    Also which delta codec won for each tensor (`delta_order`), so that its next pieces try
    that one alone; every RECHECK-th piece of a tensor tries both again (the workers note
    the winners; a stale answer costs a little space, never bytes)."""

    RECHECK = 8

    def __init__(self, budget: int = RECENT_BYTES) -> None:
        self._budget = budget
        self._pieces: OrderedDict[tuple[bytes, int], tuple[bytes, memoryview]] = OrderedDict()
        self._bytes = 0
        self._winners: dict[bytes, tuple[bool, int]] = {}  # tensor key -> (the float delta won, pieces since)

    def delta_order(self, key: bytes | None) -> str:
        won = self._winners.get(key) if key is not None else None
        if won is None or won[1] % self.RECHECK == self.RECHECK - 1:
            return FDELTA_FIRST
        return FDELTA_ONLY if won[0] else BLOSC_ONLY

    def note_winner(self, key: bytes | None, delta: Encoded | None) -> None:
        if key is not None and delta is not None:
            seen = self._winners.get(key, (False, -1))[1]
            self._winners[key] = (delta.codec in FDELTA_LANES, seen + 1)

    def get(self, key: bytes, index: int, chunk: bytes) -> memoryview | None:
        got = self._pieces.get((key, index))
        return got[1] if got is not None and got[0] == chunk else None

    def put(self, key: bytes, index: int, chunk: bytes, raw: memoryview) -> None:
        old = self._pieces.pop((key, index), None)
        if old is not None:
            self._bytes -= len(old[1])
        self._pieces[(key, index)] = (chunk, raw)
        self._bytes += len(raw)
        while self._bytes > self._budget and self._pieces:
            _k, (_c, dropped) = self._pieces.popitem(last=False)
            self._bytes -= len(dropped)
