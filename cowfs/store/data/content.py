"""A file body as an ordered list of extents (reader.py serves committed versions from them)."""
from __future__ import annotations

import bisect
import sqlite3
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, NamedTuple

from ...errors import CorruptData
from ..log.log import LOCATION_COLS, Location, location


class Extent(NamedTuple):
    """`length` bytes at `offset`: a whole chunk (`chunk` is its BLAKE3 id) or a hole (chunk None).
    A NamedTuple, not a frozen dataclass: made once per chunk on the write and read paths, with
    the GIL held, and a frozen dataclass's __init__ costs several times a tuple's."""

    offset: int
    length: int
    chunk: bytes | None
    loc: Location | None

    @property
    def end(self) -> int:
        return self.offset + self.length


ReadChunk = Callable[[bytes, Location], bytes]


@dataclass(frozen=True)
class VersionId:
    """Which file version a reader serves: reported with its CorruptData."""

    ino: int
    vid: int
    generation: int  # the generation that made this version current


def load_extents(conn: sqlite3.Connection, content_id: int | None, version: VersionId | None = None) -> list[Extent]:
    """A body's extents. Given the `version` to be read, they are checked too: an extent whose
    chunk row is missing, or extents that do not tile the body from 0 to its size (a damaged
    catalog), make the version unreadable (CorruptData) instead of reading as zeros."""
    if content_id is None:
        return []
    rows = conn.execute(
        "SELECT e.file_offset, e.length, e.cid, c.hash, c.seg_id, c.offset, c.stored_len, c.codec, c.raw_len"
        " FROM extents e LEFT JOIN chunks c ON c.cid = e.cid"
        " WHERE e.content_id = ? ORDER BY e.file_offset",
        (content_id,),
    ).fetchall()
    out = []
    for off, length, cid, h, seg, roff, stored, codec, raw_len in rows:
        if h is None:
            if cid is not None and version is not None:
                raise _corrupt(version, f"chunk {cid} of its extent at offset {off} is missing from the catalog")
            out.append(Extent(off, length, None, None))
        else:
            out.append(Extent(off, length, bytes(h), location(seg, roff, stored, codec, raw_len)))
    if version is not None:
        size = conn.execute("SELECT size FROM contents WHERE content_id=?", (content_id,)).fetchone()
        pos = 0
        for e in out:
            if e.offset != pos:
                break
            pos = e.end
        if size is None or pos != size[0]:
            raise _corrupt(version, f"its extents do not tile its {size[0] if size else '(missing)'} bytes")
    return out


def _corrupt(version: VersionId, why: str) -> CorruptData:
    err = CorruptData(f"inode {version.ino} version {version.vid} (generation {version.generation}): {why}"
                      " (damaged catalog)")
    err.ino, err.vid, err.generation = version.ino, version.vid, version.generation
    return err


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


def chunk_locations(conn: sqlite3.Connection, chunk_ids: list[bytes]) -> dict[bytes, Location]:
    """Where the catalog has each of these chunks (those it has), in one query per 500 ids."""
    out: dict[bytes, Location] = {}
    for k in range(0, len(chunk_ids), 500):
        part = chunk_ids[k:k + 500]
        for h, *rest in conn.execute(f"SELECT hash, {LOCATION_COLS} FROM chunks WHERE hash IN ({','.join('?' * len(part))})",
                                     part):
            out[bytes(h)] = location(*rest)
    return out


def any_compacted(conn: sqlite3.Connection) -> bool:
    """Whether the compactor has made any body (whose reads decode)."""
    return conn.execute("SELECT 1 FROM contents WHERE compacted = 1 LIMIT 1").fetchone() is not None
