"""A file body as an ordered list of extents, and the reader that serves it."""
from __future__ import annotations

import bisect
import sqlite3
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

from .log import Location


@dataclass(frozen=True)
class Extent:
    """`length` bytes at `offset`: a whole chunk (`chunk` is its BLAKE3 id) or a hole (chunk None)."""

    offset: int
    length: int
    chunk: bytes | None
    loc: Location | None

    @property
    def end(self) -> int:
        return self.offset + self.length


ReadChunk = Callable[[bytes, Location], bytes]


def load_extents(conn: sqlite3.Connection, content_id: int | None) -> list[Extent]:
    if content_id is None:
        return []
    rows = conn.execute(
        "SELECT e.file_offset, e.length, c.hash, c.seg_id, c.offset, c.stored_len"
        " FROM extents e LEFT JOIN chunks c ON c.cid = e.cid"
        " WHERE e.content_id = ? ORDER BY e.file_offset",
        (content_id,),
    ).fetchall()
    out = []
    for off, length, h, seg, roff, stored in rows:
        if h is None:
            out.append(Extent(off, length, None, None))
        else:
            out.append(Extent(off, length, bytes(h), Location(seg, roff, stored)))
    return out


def find_extent(extents: list[Extent], starts: list[int], pos: int) -> int:
    """Index of the extent holding byte `pos` (extents are contiguous from 0)."""
    return max(bisect.bisect_right(starts, pos) - 1, 0)


class ChunkCache:
    """A few recently read chunks, so small sequential reads do not re-read a 64 KiB chunk."""

    def __init__(self, read_chunk: ReadChunk, capacity: int = 8) -> None:
        self._read = read_chunk
        self._cap = capacity
        self._items: OrderedDict[bytes, bytes] = OrderedDict()

    def get(self, chunk: bytes, loc: Location) -> bytes:
        data = self._items.get(chunk)
        if data is None:
            data = self._read(chunk, loc)
            self._items[chunk] = data
            if len(self._items) > self._cap:
                self._items.popitem(last=False)
        else:
            self._items.move_to_end(chunk)
        return data


def read_extents(extents: list[Extent], starts: list[int], size: int, cache: ChunkCache, offset: int, length: int) -> bytes:
    end = min(offset + length, size)
    if offset >= end:
        return b""
    parts: list[bytes] = []
    i = find_extent(extents, starts, offset)
    pos = offset
    while pos < end and i < len(extents):
        ext = extents[i]
        lo, hi = max(pos, ext.offset), min(end, ext.end)
        if lo < hi:
            if ext.chunk is None:
                parts.append(bytes(hi - lo))
            else:
                data = cache.get(ext.chunk, ext.loc)  # type: ignore[arg-type]
                parts.append(data[lo - ext.offset: hi - ext.offset])
            pos = hi
        i += 1
    if pos < end:
        parts.append(bytes(end - pos))
    return b"".join(parts)


class FileReader:
    """Reads one committed version; holds only its extent list and a small chunk cache."""

    def __init__(self, extents: list[Extent], size: int, read_chunk: ReadChunk, on_close: Callable[[], None] | None = None) -> None:
        self.extents = extents
        self.size = size
        self._starts = [e.offset for e in extents]
        self._cache = ChunkCache(read_chunk)
        self._on_close = on_close

    def read(self, offset: int, length: int) -> bytes:
        return read_extents(self.extents, self._starts, self.size, self._cache, offset, length)

    def close(self) -> None:
        if self._on_close is not None:
            self._on_close()
            self._on_close = None

    def __enter__(self) -> "FileReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
