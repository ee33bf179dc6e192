"""Packs and their indexes: the two kinds of data object in the bucket (docs/format.md, section 9).

A pack is chunk records exactly as a segment holds them (64-byte header, payload, zero
padding to 64), back to back from offset 0; its name is the BLAKE3-256 of its bytes, in
hex. Its index lists each record's chunk id, offset, lengths and codec; it is a function of
the pack's bytes alone, so whoever writes it (the uploader, or a later pass adopting a pack
whose index a crash kept from being written) writes the same object.
"""
from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

import blake3

from ..errors import CorruptData
from ..store.log.records import HEADER_SIZE, RecordError, check_payload, decode_record_header, record_span

INDEX_MAGIC = b"CWFSIDX1"
INDEX_HEAD = struct.Struct("<8sII Q 32s")  # magic, version, count, pack size, pack id
INDEX_ENTRY = struct.Struct("<32s Q I I B 3x")  # chunk id, offset, stored_len, raw_len, codec
INDEX_VERSION = 1
NAME_LEN = 64  # hex digits of a pack's name


@dataclass(frozen=True)
class PackEntry:
    chunk_id: bytes
    offset: int
    stored_len: int
    raw_len: int
    codec: int

    @property
    def span(self) -> int:
        return record_span(self.stored_len)


def pack_name(data: bytes | memoryview) -> str:
    return blake3.blake3(data, max_threads=blake3.blake3.AUTO).hexdigest()


def is_pack_name(name: str) -> bool:
    return len(name) == NAME_LEN and all(c in "0123456789abcdef" for c in name)


def entries_of_pack(data: bytes | memoryview) -> list[PackEntry]:
    """Walk a pack's records, checking every header and payload CRC (CorruptData otherwise)."""
    out: list[PackEntry] = []
    off = 0
    view = memoryview(data)
    while off < len(view):
        try:
            head = decode_record_header(view[off:off + HEADER_SIZE])
            check_payload(head, view[off + HEADER_SIZE:off + HEADER_SIZE + head.stored_len])
        except RecordError as e:
            raise CorruptData(f"pack record at offset {off}: {e}") from None
        if off + head.span > len(view):
            raise CorruptData(f"pack record at offset {off}: runs past the end")
        out.append(PackEntry(head.chunk_id, off, head.stored_len, head.raw_len, head.codec))
        off += head.span
    return out


def encode_index(name: str, pack_size: int, entries: list[PackEntry]) -> bytes:
    parts = [INDEX_HEAD.pack(INDEX_MAGIC, INDEX_VERSION, len(entries), pack_size, bytes.fromhex(name))]
    parts += [INDEX_ENTRY.pack(e.chunk_id, e.offset, e.stored_len, e.raw_len, e.codec) for e in entries]
    body = b"".join(parts)
    return body + struct.pack("<I", zlib.crc32(body))


@dataclass(frozen=True)
class PackIndex:
    name: str
    size: int
    entries: list[PackEntry]


def decode_index(data: bytes, expect_name: str | None = None) -> PackIndex:
    if len(data) < INDEX_HEAD.size + 4:
        raise CorruptData("pack index truncated")
    (crc,) = struct.unpack_from("<I", data, len(data) - 4)
    if zlib.crc32(data[:-4]) != crc:
        raise CorruptData("pack index checksum mismatch")
    magic, version, count, size, raw_name = INDEX_HEAD.unpack_from(data)
    if magic != INDEX_MAGIC or version != INDEX_VERSION:
        raise CorruptData("not a cowfs pack index (version 1)")
    if len(data) != INDEX_HEAD.size + count * INDEX_ENTRY.size + 4:
        raise CorruptData("pack index length does not match its count")
    name = raw_name.hex()
    if expect_name is not None and name != expect_name:
        raise CorruptData(f"pack index names pack {name[:16]}, not {expect_name[:16]}")
    entries = [PackEntry(*INDEX_ENTRY.unpack_from(data, INDEX_HEAD.size + k * INDEX_ENTRY.size)) for k in range(count)]
    return PackIndex(name, size, entries)


class PackArena:
    """Buffers a pack is laid out in, reused pack after pack: bytearrays of `part` bytes each
    (the size of one part of a multipart upload). A PUT sends a bytearray as it is, where a
    slice of one, or bytes made from it, is a copy into fresh memory; records are read
    straight into their place, so a pack costs no join either (docs/benchmarks.md, remote
    tier, twelfth round)."""

    def __init__(self, capacity: int, part: int) -> None:
        self.part = part = max(min(part, capacity), 1)  # no part larger than what is laid out
        self.parts = [bytearray(part) for _ in range(-(-capacity // part))]
        self.capacity = len(self.parts) * part

    def views(self, start: int, length: int) -> list[memoryview]:
        """Buffers covering bytes start..start+length of the layout, in order."""
        if start + length > self.capacity:
            raise ValueError(f"pack layout of {start + length} bytes exceeds the arena's {self.capacity}")
        out: list[memoryview] = []
        while length > 0:
            k, within = divmod(start, self.part)
            n = min(self.part - within, length)
            out.append(memoryview(self.parts[k])[within:within + n])
            start += n
            length -= n
        return out

    def bodies(self, size: int) -> list[bytearray | bytes]:
        """The first `size` bytes as upload parts: whole parts as they are, the last one cut."""
        full, rest = divmod(size, self.part)
        out: list[bytearray | bytes] = list(self.parts[:full])
        if rest:
            out.append(bytes(memoryview(self.parts[full])[:rest]))
        return out

    def name(self, size: int) -> str:
        h = blake3.blake3(max_threads=blake3.blake3.AUTO)
        for v in self.views(0, size):
            h.update(v)
        return h.hexdigest()


class PackBuilder:
    """Records gathered for one pack, in the order added; with an arena, records are read
    into `reserve`'s buffers first and `add` takes their views there."""

    def __init__(self, arena: PackArena | None = None) -> None:
        self.arena = arena
        self.parts: list[bytes | memoryview] = []
        self.entries: list[PackEntry] = []
        self.size = 0

    def reserve(self, length: int) -> list[memoryview]:
        """(with an arena) Where the next `length` bytes of records go."""
        assert self.arena is not None
        return self.arena.views(self.size, length)

    def add(self, record: bytes | memoryview, chunk_id: bytes, stored_len: int, raw_len: int, codec: int) -> None:
        self.entries.append(PackEntry(chunk_id, self.size, stored_len, raw_len, codec))
        self.parts.append(record)
        self.size += len(record)

    def finish(self, avoid: set[str] | frozenset[str] = frozenset()) -> tuple[str, list[bytes | bytearray], bytes]:
        """(name, pack bytes as upload parts, index bytes). A name in `avoid` (a pack a remote
        gc doomed: it may be deleted whatever is PUT under its name meanwhile) is never given:
        the records are laid out again, in reverse order, then with the first record once
        more at the end, until the bytes hash to another name; `entries` and `size` follow
        the layout."""
        if self.arena is not None:
            name = self.arena.name(self.size)
            if name not in avoid:
                return name, self.arena.bodies(self.size), encode_index(name, self.size, self.entries)
        data = b"".join(self.parts)
        name = pack_name(data)
        tried_reverse = len(self.parts) < 2
        while name in avoid:
            if not tried_reverse:
                tried_reverse = True
                order = list(zip(self.parts, self.entries))[::-1]
            else:
                order = list(zip(self.parts, self.entries)) + [(self.parts[0], self.entries[0])]
            self.parts, self.entries, self.size = [], [], 0
            for rec, e in order:
                self.add(rec, e.chunk_id, e.stored_len, e.raw_len, e.codec)
            data = b"".join(self.parts)
            name = pack_name(data)
        return name, [data], encode_index(name, len(data), self.entries)
