"""Evicted segments: segments whose records are kept only in the bucket (docs/design.md,
section 17, "Capacity"; the map's bytes: docs/format.md, section 9.8).

A segment is evicted by writing its map, `segments/NNNNNNNNNNNNNNNN.remote` (for each record
the catalog still uses: its offset and span in the segment, and the pack and offset that hold
the same record bytes), durably, and then deleting the segment file. From then on a read of
the segment is served from the packs, through a `PackReader` the remote tier gives (the
engine knows nothing of S3), and checked as any read from the log is: record header, chunk
id, BLAKE3. The catalog is not changed: chunk rows keep their segment and offset.
"""
from __future__ import annotations

import bisect
import struct
import threading
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

from ...errors import CorruptData, CowfsError
from .layout import SEGMENTS_DIR, write_durably

MAP_MAGIC = b"CWFSEVM1"
MAP_VERSION = 1
MAP_HEAD = struct.Struct("<8sIIQQII")  # magic, version, entries, seg_id, committed end, packs, 0
MAP_PACK = struct.Struct("<32sQ")  # pack name (raw BLAKE3-256), pack size
MAP_ENTRY = struct.Struct("<QQII")  # offset in the segment, offset in the pack, span, pack number
MAP_SUFFIX = ".remote"
RESTORE_SUFFIX = ".restore"  # a segment being fetched back (evict.restore_segment)


class PackReader(Protocol):
    """Reads byte ranges of packs (the remote tier's side of an evicted segment)."""

    def read_into(self, pack: str, size: int, offset: int, buffers: list[memoryview]) -> int: ...
    def will_need(self, pack: str, size: int, offset: int, length: int) -> None: ...
    def close(self) -> None: ...


@dataclass(frozen=True)
class MapEntry:
    seg_offset: int
    pack_offset: int
    span: int
    pack: int  # index into EvictionMap.packs


@dataclass(frozen=True)
class EvictionMap:
    seg_id: int
    committed_end: int
    packs: list[tuple[str, int]]  # (name in hex, size)
    entries: list[MapEntry]  # sorted by seg_offset, not overlapping

    def encode(self) -> bytes:
        parts = [MAP_HEAD.pack(MAP_MAGIC, MAP_VERSION, len(self.entries), self.seg_id, self.committed_end,
                               len(self.packs), 0)]
        parts += [MAP_PACK.pack(bytes.fromhex(name), size) for name, size in self.packs]
        parts += [MAP_ENTRY.pack(e.seg_offset, e.pack_offset, e.span, e.pack) for e in self.entries]
        body = b"".join(parts)
        return body + struct.pack("<I", zlib.crc32(body))


def map_path(root: Path, seg_id: int) -> Path:
    return root / SEGMENTS_DIR / f"{seg_id:016d}{MAP_SUFFIX}"


def decode_map(data: bytes, where: str) -> EvictionMap:
    if len(data) < MAP_HEAD.size + 4:
        raise CorruptData(f"{where}: eviction map truncated")
    (crc,) = struct.unpack_from("<I", data, len(data) - 4)
    if zlib.crc32(data[:-4]) != crc:
        raise CorruptData(f"{where}: eviction map checksum mismatch")
    magic, version, count, seg_id, end, n_packs, _ = MAP_HEAD.unpack_from(data)
    if magic != MAP_MAGIC or version != MAP_VERSION:
        raise CorruptData(f"{where}: not a cowfs eviction map (version {MAP_VERSION})")
    if len(data) != MAP_HEAD.size + n_packs * MAP_PACK.size + count * MAP_ENTRY.size + 4:
        raise CorruptData(f"{where}: eviction map length does not match its counts")
    pos = MAP_HEAD.size
    packs = []
    for _ in range(n_packs):
        raw, size = MAP_PACK.unpack_from(data, pos)
        packs.append((raw.hex(), size))
        pos += MAP_PACK.size
    entries = []
    for _ in range(count):
        e = MapEntry(*MAP_ENTRY.unpack_from(data, pos))
        if e.pack >= n_packs or e.pack_offset + e.span > packs[e.pack][1]:
            raise CorruptData(f"{where}: eviction map entry at {e.seg_offset} points outside its pack")
        entries.append(e)
        pos += MAP_ENTRY.size
    return EvictionMap(seg_id, end, packs, entries)


def read_map(root: Path, seg_id: int) -> EvictionMap | None:
    """The segment's eviction map, or None when it has none (it is local)."""
    path = map_path(root, seg_id)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    found = decode_map(data, path.name)
    if found.seg_id != seg_id:
        raise CorruptData(f"{path.name}: eviction map of segment {found.seg_id}")
    return found


def write_map(root: Path, emap: EvictionMap) -> None:
    write_durably(map_path(root, emap.seg_id), emap.encode())


def evicted_ids(root: Path) -> set[int]:
    out = set()
    for path in (root / SEGMENTS_DIR).glob(f"*{MAP_SUFFIX}"):
        if path.stem.isdigit():
            out.add(int(path.stem))
    return out


def _carve(buffers: list[memoryview], lengths: list[int]) -> list[list[memoryview]]:
    """Split the back-to-back `buffers` into consecutive groups of `lengths` bytes."""
    views = [b for b in buffers if len(b)]
    out: list[list[memoryview]] = []
    for n in lengths:
        group: list[memoryview] = []
        while n and views:
            v = views[0]
            k = min(n, len(v))
            group.append(v[:k])
            n -= k
            if k == len(v):
                views.pop(0)
            else:
                views[0] = v[k:]
        out.append(group)
    return out


class EvictedSegment:
    """An evicted segment, read like a segment file (`read_into`, `read`, `will_need`): each
    range is served from the packs its map names. Bytes the map does not cover (records no
    version used when it was evicted) read short, which the log reports as a truncated record."""

    def __init__(self, emap: EvictionMap, reader: PackReader) -> None:
        self.map = emap
        self.reader = reader
        self._starts = [e.seg_offset for e in emap.entries]
        self.size = emap.committed_end

    def _pieces(self, offset: int, length: int) -> list[tuple[MapEntry, int, int]]:
        """(entry, skip into it, bytes) covering [offset, offset+length) up to the first gap."""
        out: list[tuple[MapEntry, int, int]] = []
        k = bisect.bisect_right(self._starts, offset) - 1
        pos, end = offset, offset + length
        while pos < end and 0 <= k < len(self.map.entries):
            e = self.map.entries[k]
            if not e.seg_offset <= pos < e.seg_offset + e.span:
                break
            skip = pos - e.seg_offset
            n = min(e.span - skip, end - pos)
            out.append((e, skip, n))
            pos += n
            k += 1
        return out

    def read_into(self, offset: int, buffers: list[memoryview]) -> int:
        pieces = self._pieces(offset, sum(len(b) for b in buffers))
        # records lying back to back in one pack too are read at once
        runs: list[tuple[int, int, int]] = []  # (pack, pack offset, bytes)
        for e, skip, n in pieces:
            if runs and runs[-1][0] == e.pack and runs[-1][1] + runs[-1][2] == e.pack_offset + skip:
                runs[-1] = (e.pack, runs[-1][1], runs[-1][2] + n)
            else:
                runs.append((e.pack, e.pack_offset + skip, n))
        got = 0
        for (pack, pack_offset, n), group in zip(runs, _carve(buffers, [r[2] for r in runs])):
            name, size = self.map.packs[pack]
            k = self.reader.read_into(name, size, pack_offset, group)
            got += k
            if k < n:
                break
        return got

    def read(self, offset: int, length: int) -> bytes:
        buf = bytearray(length)
        n = self.read_into(offset, [memoryview(buf)])
        return bytes(buf[:n])

    def will_need(self, offset: int, length: int) -> None:
        for e, skip, n in self._pieces(offset, length)[:64]:
            name, size = self.map.packs[e.pack]
            self.reader.will_need(name, size, e.pack_offset + skip, n)

    def allocated_bytes(self) -> int:
        return 0

    def close(self) -> None:
        pass


class EvictedSegments:
    """The log's way to evicted segments: maps read from disk, one pack reader made (by the
    remote tier's factory) at the first read that needs it."""

    def __init__(self, root: Path, factory: Callable[[Path], PackReader] | None) -> None:
        self.root = root
        self._factory = factory
        self._reader: PackReader | None = None
        self._lock = threading.Lock()

    def open(self, seg_id: int) -> EvictedSegment | None:
        emap = read_map(self.root, seg_id)
        if emap is None:
            return None
        with self._lock:
            if self._reader is None:
                if self._factory is None:
                    raise CorruptData(f"segment {seg_id} is kept only in the bucket, and this process was "
                                      "opened without the store's remote")
                try:
                    self._reader = self._factory(self.root)
                except CowfsError as e:
                    raise CorruptData(f"segment {seg_id} is kept only in the bucket: {e}") from None
        return EvictedSegment(emap, self._reader)

    def close(self) -> None:
        with self._lock:
            if self._reader is not None:
                self._reader.close()
                self._reader = None
