"""Where a tensor file's pieces lie, learnt from its bytes while it is written.

A write session cuts its stream batch by batch (data/session.py). Before each cut it asks
its `WriteLayout`, given the bytes the batch holds, which regions of the file to cut as tensor
pieces: at the tensor's start, every PIECE step, and its end (pieces.py's rule, so the
compactor later finds the same pieces, and an unchanged tensor gives the same chunks in the
next checkpoint wherever it lies). Everything else is cut by content as before.

Recognised: **safetensors**, whose header (8-byte length, then JSON) gives every tensor's
offsets before any of their bytes. The header must lie whole in the first batch; otherwise
the file is cut by content. (torch.save archives are not: torch writes each zip entry with
its sizes in a data descriptor after the data, so the entries' ends are not known while the
file is written.)

Only the header is read, never tensor data. A wrong guess only costs dedup, never
correctness: the cuts are a choice of where chunks end, every byte is stored either way.
"""
from __future__ import annotations

import bisect
import struct
from typing import Callable

from .formats import safetensors
from .formats._base import Reader
from .pieces import pieced

Region = tuple[int, int, int]  # file offsets [start, end) cut every `step` bytes from start
ReadFn = Callable[[int, int], bytes]  # (file offset, length) -> up to that many bytes there

MAX_SAFETENSORS_HEADER = 16 << 20  # a header must lie whole in the first batch
SNIFF = 64 << 10
UNKNOWN_SIZE = 1 << 62  # what the parser is told the file's size is while it is written


class WriteLayout:
    """What one write stream's bytes say of its tensors, learnt from its first batch."""

    def __init__(self) -> None:
        self.known: list[Region] = []  # the regions, sorted, not overlapping
        self._ends: list[int] = []
        self._looked = False

    def learn(self, start: int, end: int, read: ReadFn) -> None:
        """Read the header the bytes [start, end) of the file hold (`read` serves exactly
        those): only the first batch's (start 0) is looked at."""
        if self._looked:
            return
        self._looked = True
        if start != 0:
            return
        head = read(0, min(end, SNIFF))
        if safetensors.looks_like(head, max(end, 10)):
            self.known = _safetensors_regions(head, end, read)
            self._ends = [r[1] for r in self.known]

    def regions(self, start: int, end: int) -> list[Region]:
        """The known regions that reach into [start, end) (a bisection: a batch of a file with
        many tensors does not look at all of them)."""
        i = bisect.bisect_right(self._ends, start)
        out: list[Region] = []
        while i < len(self.known) and self.known[i][0] < end:
            out.append(self.known[i])
            i += 1
        return out


def _safetensors_regions(head: bytes, end: int, read: ReadFn) -> list[Region]:
    (n,) = struct.unpack_from("<Q", head, 0)
    if 8 + n > min(end, MAX_SAFETENSORS_HEADER):
        return []
    raw = bytes(head[:8 + n] if len(head) >= 8 + n else read(0, 8 + n))
    try:
        # the file's final size is not known yet: the parser checks the header against itself
        found = safetensors.parse(Reader(raw, UNKNOWN_SIZE, lambda o, k: raw[o:o + k]))
    except Exception:  # noqa: BLE001 - Malformed, or anything a hostile header provokes: it never fails a write
        return []
    return [(r.offset, r.offset + r.length, step) for r, step in pieced(sorted(found, key=lambda r: r.offset))]
