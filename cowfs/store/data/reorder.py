"""What a write session keeps beside its stream to take the kernel's writeback order.

The kernel's writeback cache sends a sequentially written file's pages almost, not quite,
in order:
  * a page is sent ahead of one before it (two flushers, a page under writeback skipped):
    `ReorderWindow` holds such writes until the gap before them is written;
  * a page dirtied again while it was being written back (a write ending mid-page, the
    next write filling it) goes out again whole, its head already in the stream:
    `StreamTail` keeps the stream's last bytes to see that the head is the same.
Neither copies: they keep the writes' own objects.
"""
from __future__ import annotations

import bisect
from typing import Iterator

Buffer = bytes | memoryview


class ReorderWindow:
    """Writes beyond the stream's end, by offset. They never overlap one another: a write
    over held ones replaces their bytes it covers."""

    def __init__(self) -> None:
        self.writes: dict[int, Buffer] = {}
        self.starts: list[int] = []  # sorted
        self.held = 0  # bytes

    def __bool__(self) -> bool:
        return bool(self.starts)

    def hold(self, offset: int, data: Buffer, stream_pos: int, limit: int) -> bool:
        """Keep `data` at `offset` (> stream_pos); False if it ends more than `limit` past
        stream_pos (a write far ahead, a sparse or random write, will not join the stream
        soon). Where it overlaps writes held already it replaces their bytes (the newer
        write wins). So the window holds at most `limit` bytes."""
        end = offset + len(data)
        if end - stream_pos > limit:
            return False
        i = bisect.bisect_left(self.starts, offset)
        if i > 0 and self.starts[i - 1] + len(self.writes[self.starts[i - 1]]) > offset:
            i -= 1
        j, new = i, [(offset, data)]
        while j < len(self.starts) and self.starts[j] < end:
            start = self.starts[j]
            old = self.writes.pop(start)
            self.held -= len(old)
            if start < offset:
                new.insert(0, (start, memoryview(old)[:offset - start]))
            if start + len(old) > end:
                new.append((end, memoryview(old)[end - start:]))
            j += 1
        self.starts[i:j] = [start for start, _ in new]
        for start, part in new:
            self.writes[start] = part
            self.held += len(part)
        return True

    def first(self) -> int:
        """The offset of the first held write (the window is not empty)."""
        return self.starts[0]

    def reached(self, stream_pos: int) -> Buffer | None:
        """The first held write if the stream has reached it: its part past stream_pos (a held
        write is older than the append that reached it, so the part that append covered is
        dropped), b"" if none is; None if the stream has not reached it. It stays held until
        `pop_first`."""
        if not self.starts or self.starts[0] > stream_pos:
            return None
        start = self.starts[0]
        data = self.writes[start]
        skip = stream_pos - start
        return b"" if skip >= len(data) else memoryview(data)[skip:] if skip else data

    def pop_first(self) -> None:
        self.held -= len(self.writes.pop(self.starts.pop(0)))

    def items(self) -> Iterator[tuple[int, Buffer]]:
        for start in self.starts:
            yield start, self.writes[start]

    def clear(self) -> None:
        self.writes, self.starts, self.held = {}, [], 0


class StreamTail:
    """The stream's last appends, at least `keep` bytes of them when the stream has that many."""

    def __init__(self, keep: int) -> None:
        self._keep = keep
        self._parts: list[Buffer] = []
        self._len = 0

    def push(self, data: Buffer) -> None:
        self._parts.append(data)
        self._len += len(data)
        while self._len - len(self._parts[0]) >= self._keep:
            self._len -= len(self._parts.pop(0))

    def clear(self) -> None:
        self._parts, self._len = [], 0

    def same(self, back: int, data: Buffer) -> bool:
        """Whether `data` starts with the stream's bytes from `back` bytes before its end up to
        `len(data)` of them (False when the tail does not reach that far back)."""
        if back <= 0 or back > self._len:
            return False
        want = min(back, len(data))
        skip, have = self._len - back, []
        for part in self._parts:
            if skip < len(part) and want:
                have.append(memoryview(part)[skip:skip + want])
                want -= len(have[-1])
            skip = max(0, skip - len(part))
        return b"".join(have) == memoryview(data)[:min(back, len(data))]
