"""Where a read of ranges of a version goes (FileReader.read_ranges_into, gets of ranges):
ranges widened to the whole chunks they touch, and cut into spans that begin at extent
starts, each read into its place in one destination; the parts of holes a range only enters
are zero-filled there. Pure functions of the version's extents (which tile it from 0)."""
from __future__ import annotations

from typing import Callable

from .content import Extent, find_extent

_ZEROS = memoryview(bytes(1 << 20))


def zero_fill(buf: memoryview, lo: int, hi: int) -> None:
    """buf[lo:hi] = zeros, a MiB at a time (a hole may be far larger than what memory holds)."""
    for at in range(lo, hi, len(_ZEROS)):
        n = min(hi - at, len(_ZEROS))
        buf[at:at + n] = _ZEROS[:n]


def widen(extents: list[Extent], starts: list[int], size: int,
          ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The ranges [lo, hi) (sorted, not overlapping) cut at `size`, widened to the whole chunks
    they touch (not into holes, which may be any size) and joined where they then meet."""
    out: list[tuple[int, int]] = []
    for lo, hi in ranges:
        hi = min(hi, size)
        if lo >= hi:
            continue
        first = extents[find_extent(extents, starts, lo)]
        last = extents[find_extent(extents, starts, hi - 1)]
        lo = first.offset if first.chunk is not None else lo
        hi = last.end if last.chunk is not None else hi
        if out and out[-1][1] >= lo:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def range_spans(extents: list[Extent], starts: list[int], size: int, ends: set[int],
                ranges: list[tuple[int, int]], window: int,
                zero: Callable[[int, int], None]) -> list[tuple[int, int, int]]:
    """(lo, hi, where in the destination) of the spans to read for `ranges` (as `widen` makes
    them), which lie back to back in the destination: each span begins at an extent start and
    is cut at a chunk start once it holds `window` bytes. Where a range begins or ends inside
    a hole, `zero(d0, d1)` is called for those bytes' place instead. `ends`: the extents'
    ends. ValueError for a range that begins or ends inside a chunk."""
    spans: list[tuple[int, int, int]] = []
    at = 0  # where the range begins in the destination
    for lo, hi in ranges:
        end_at = at + hi - lo
        head = extents[find_extent(extents, starts, lo)]
        if head.chunk is None and head.offset < lo:
            z = min(head.end, hi)
            zero(at, at + z - lo)
            at, lo = at + z - lo, z
        if lo < hi:
            tail = extents[find_extent(extents, starts, hi - 1)]
            if tail.chunk is None and tail.end > hi:
                z = max(tail.offset, lo)
                zero(at + z - lo, at + hi - lo)
                hi = z
        if lo < hi:
            i = find_extent(extents, starts, lo)
            if extents[i].offset != lo or (hi < size and hi not in ends):
                raise ValueError(f"the range [{lo}, {hi}) begins or ends inside a chunk")
            first = lo
            for e in extents[i + 1:]:
                if e.offset >= hi:
                    break
                if e.chunk is not None and e.offset - first >= window:
                    spans.append((first, e.offset, at + first - lo))
                    first = e.offset
            spans.append((first, hi, at + first - lo))
        at = end_at
    return spans
