"""Writes that are not sequential appends, kept in an unlinked spill file.

The overlay maps file ranges to positions in the spill file; a newer write
replaces the part of any older range it covers. Memory holds only the range
list, so a session that rewrites a 10 GiB file at random offsets stays small.
"""
from __future__ import annotations

import bisect
import os
import tempfile
from pathlib import Path
from typing import Iterator


class Overlay:
    def __init__(self, spill_dir: Path) -> None:
        self._dir = spill_dir
        self._fd = -1
        self._spill_end = 0
        self._starts: list[int] = []
        self._ranges: list[tuple[int, int, int]] = []  # (start, end, spill position)

    def __bool__(self) -> bool:
        return bool(self._ranges)

    def _spill(self, data: bytes | memoryview) -> int:
        if self._fd < 0:
            self._dir.mkdir(exist_ok=True)
            fd, name = tempfile.mkstemp(prefix="spill-", dir=self._dir)
            os.unlink(name)
            self._fd = fd
        pos = self._spill_end
        view = memoryview(data)
        off = pos
        while view:
            n = os.pwrite(self._fd, view, off)
            view = view[n:]
            off += n
        self._spill_end = off
        return pos

    def write(self, offset: int, data: bytes | memoryview) -> None:
        if not data:
            return
        pos = self._spill(data)
        self._insert(offset, offset + len(data), pos)

    def write_under(self, offset: int, data: bytes | memoryview) -> None:
        """Write `data` at `offset` only where no range is: older bytes under newer ones."""
        view, pos = memoryview(data), offset
        for s, e, _spill in list(self.ranges(offset, offset + len(view))):
            self.write(pos, view[pos - offset:s - offset])
            pos = e
        self.write(pos, view[pos - offset:])

    def _insert(self, a: int, b: int, pos: int) -> None:
        i = max(bisect.bisect_right(self._starts, a) - 1, 0)
        while i < len(self._ranges) and self._ranges[i][1] <= a:
            i += 1
        j = i
        keep: list[tuple[int, int, int]] = []
        while j < len(self._ranges) and self._ranges[j][0] < b:
            s, e, p = self._ranges[j]
            if s < a:
                keep.append((s, a, p))
            if e > b:
                keep.append((b, e, p + (b - s)))
            j += 1
        new = [r for r in keep if r[1] <= a] + [(a, b, pos)] + [r for r in keep if r[0] >= b]
        # merge with the neighbour on the left when both the file and spill ranges continue
        if i > 0 and new[0] == (a, b, pos):
            ps, pe, pp = self._ranges[i - 1]
            if pe == a and pp + (pe - ps) == pos:
                i -= 1
                new[0] = (ps, b, pp)
        self._ranges[i:j] = new
        self._starts[i:j] = [r[0] for r in new]

    def clip(self, size: int) -> None:
        """Forget everything at or beyond `size` (truncate)."""
        out = []
        for s, e, p in self._ranges:
            if s >= size:
                break
            out.append((s, min(e, size), p))
        self._ranges = out
        self._starts = [r[0] for r in out]

    def ranges(self, lo: int, hi: int) -> Iterator[tuple[int, int, int]]:
        """Ranges intersecting [lo, hi), clipped to it, in order: (start, end, spill position)."""
        i = max(bisect.bisect_right(self._starts, lo) - 1, 0)
        while i < len(self._ranges):
            s, e, p = self._ranges[i]
            if s >= hi:
                break
            if e > lo:
                cs, ce = max(s, lo), min(e, hi)
                yield cs, ce, p + (cs - s)
            i += 1

    def read(self, spill_pos: int, length: int) -> bytes:
        return os.pread(self._fd, length, spill_pos)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._ranges, self._starts, self._spill_end = [], [], 0
