"""Where a tensor file's pieces lie, learnt from its bytes while it is written.

A write session cuts its stream batch by batch (data/session.py). Before each cut it asks
its `WriteLayout`, given the bytes the batch holds, which regions of the file to cut as tensor
pieces: at the tensor's start, every PIECE step, and its end (pieces.py's rule, so the
compactor later finds the same pieces, and an unchanged tensor gives the same chunks in the
next checkpoint wherever it lies). Everything else is cut by content as before.

Recognised:
  * **safetensors**, whose header (8-byte length, then JSON) gives every tensor's offsets
    before any of their bytes; the header must lie whole in the first batch;
  * **NumPy .npy**, whose header gives the array's dtype and shape (one region);
  * **torch.save archives and .distcp files** (torch.save archives back to back), walked
    record by record as the batches come (write_zip.py): each archive's data.pkl gives its
    storages' sizes before their entries. Where a record is not whole in a batch, the
    layout asks for a hold there (a region the chunker cuts at its start and carries from):
    the next batch begins with it.
Anything else is cut by content.

Only headers and pickles are read, never tensor data. A wrong guess only costs dedup, never
correctness: the cuts are a choice of where chunks end, every byte is stored either way.
"""
from __future__ import annotations

import bisect
import struct
from typing import Callable

from .formats import npy, safetensors
from .formats._base import Reader, TensorRegion
from .pieces import pieced
from .write_zip import MAX_WAIT, ZipWalk

Region = tuple[int, int, int]  # file offsets [start, end) cut every `step` bytes from start
ReadFn = Callable[[int, int], bytes]  # (file offset, length) -> up to that many bytes there

MAX_SAFETENSORS_HEADER = 16 << 20  # a header must lie whole in the first batch
SNIFF = 64 << 10
UNKNOWN_SIZE = 1 << 62  # what the parser is told the file's size is while it is written
HOLD = MAX_WAIT  # a hold's region and step: the batch ends before its first step, so all of it is carried


class WriteLayout:
    """What one write stream's bytes say of its tensors, learnt batch by batch."""

    def __init__(self) -> None:
        self.known: list[Region] = []  # the regions, sorted, not overlapping
        self._ends: list[int] = []
        self._looked = False
        self._walk: ZipWalk | None = None
        self._hold: int | None = None

    def learn(self, start: int, end: int, read: ReadFn, final: bool = False) -> None:
        """Learn from the bytes [start, end) of the file (`read` serves exactly those): the
        first batch's (start 0; held whole until it has SNIFF bytes) says what the file is;
        a torch archive is walked on in each batch. `final`: the last batch. Never raises: a
        header the parsers refuse, or that makes them raise anything at all, gives no
        regions, and the write goes on."""
        self._hold = None
        try:
            if not self._looked:
                if start == 0 and end < SNIFF and not final:
                    self._hold = 0  # too few bytes to tell what the file is: keep them whole for the next batch
                    return
                self._looked = True
                if start == 0:
                    self._first(end, read)
            if self._walk is not None:
                found, self._hold = self._walk.advance(end, read, final)
                self._add(found)
        except Exception:  # noqa: BLE001 - whatever a hostile header provokes: it never fails a write
            self._walk, self._hold = None, None

    def _first(self, end: int, read: ReadFn) -> None:
        head = read(0, min(end, SNIFF))
        if safetensors.looks_like(head, max(end, 10)):
            self._add(_safetensors_regions(head, end, read))
        elif npy.looks_like(head):
            self._add(npy.parse(Reader(head, UNKNOWN_SIZE, read)))
        elif ZipWalk.begins(head):
            self._walk = ZipWalk()

    def _add(self, found: list[TensorRegion]) -> None:
        """Regions in file order after those known, cut by the compactor's rule."""
        last = self._ends[-1] if self._ends else 0
        for r, step in pieced(sorted((r for r in found if r.offset >= last), key=lambda r: r.offset)):
            self.known.append((r.offset, r.offset + r.length, step))
            self._ends.append(r.offset + r.length)

    def regions(self, start: int, end: int) -> list[Region]:
        """The known regions that reach into [start, end) (a bisection: a batch of a file with
        many tensors does not look at all of them), then the hold, if the walk waits on a
        record that is not whole: cut at it, and carry from it."""
        i = bisect.bisect_right(self._ends, start)
        out: list[Region] = []
        while i < len(self.known) and self.known[i][0] < end:
            out.append(self.known[i])
            i += 1
        if self._hold is not None and start <= self._hold < end and (not out or out[-1][1] <= self._hold):
            out.append((self._hold, self._hold + HOLD, HOLD))
        return out


def _safetensors_regions(head: bytes, end: int, read: ReadFn) -> list[TensorRegion]:
    (n,) = struct.unpack_from("<Q", head, 0)
    if 8 + n > min(end, MAX_SAFETENSORS_HEADER):
        return []
    raw = bytes(head[:8 + n] if len(head) >= 8 + n else read(0, 8 + n))
    # the file's final size is not known yet: the parser checks the header against itself
    return safetensors.parse(Reader(raw, UNKNOWN_SIZE, lambda o, k: raw[o:o + k]))
