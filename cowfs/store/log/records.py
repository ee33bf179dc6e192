"""Byte layout of log segments: the segment header and self-describing records.

All integers are little-endian. See docs/format.md for the table.

Segment header (bytes 0..63 of every segment; records start at DATA_START):
  0  8  magic b"CWFS-SEG"
  8  4  format version (u32)
  12 4  reserved, 0
  16 8  segment id (u64)
  24 16 store uuid (raw 16 bytes)
  40 8  created, ns since the epoch (u64)
  48 12 reserved, 0
  60 4  crc32 of bytes 0..59

Record (starts at a multiple of RECORD_ALIGN; header then payload, then zero
padding up to the next multiple of RECORD_ALIGN):
  0  4  magic b"CWFR"
  4  1  kind (1 = chunk)
  5  1  codec (0 = raw bytes, 1 = grouped + compressed, 2 = XOR delta, 3 = subtraction delta; codecs.py)
  6  2  reserved, 0
  8  4  stored length of the payload (u32)
  12 4  raw (decoded) length (u32)
  16 32 chunk id: BLAKE3-256 of the raw bytes
  48 4  crc32 of the stored payload
  52 8  reserved, 0
  60 4  crc32 of header bytes 0..59

Every crc32 is zlib's (the gzip one). Payload CRCs are computed by ISA-L
(`_native.crc32`, the same value at several times zlib's speed, GIL released); the
64-byte headers keep zlib.crc32, which is as cheap at that size.
"""
from __future__ import annotations

import mmap
import struct
import uuid
import zlib
from dataclasses import dataclass
from typing import Iterator, NamedTuple

from ... import _native

SEGMENT_MAGIC = b"CWFS-SEG"
SEGMENT_HEADER = struct.Struct("<8sII Q 16s Q 12x I")
DATA_START = 4096

RECORD_MAGIC = b"CWFR"
RECORD_HEADER = struct.Struct("<4sBBH II 32s I 8x I")
HEADER_SIZE = RECORD_HEADER.size  # 64
RECORD_ALIGN = 64
KIND_CHUNK = 1
CODEC_RAW = 0  # the payload is the raw bytes
CODEC_GROUPED = 1  # a Blosc2 chunk of the raw bytes (codecs.py)
CODEC_XOR = 2  # the base chunk's id, then a Blosc2 chunk of raw XOR base (codecs.py)
CODEC_SUB = 3  # the base chunk's id, then a Blosc2 chunk of zigzag(raw - base) per element (codecs.py)
CODEC_FDELTA = 4  # the base chunk's id, then the context-modelled float difference (native/floatcodec.c)
CODEC_FDELTA32 = 5  # the same, its symbols coded with 32 interleaved rANS states instead of 4
KNOWN_CODECS = (CODEC_RAW, CODEC_GROUPED, CODEC_XOR, CODEC_SUB, CODEC_FDELTA, CODEC_FDELTA32)
MAX_PAYLOAD = 1 << 24

assert SEGMENT_HEADER.size == 64 and HEADER_SIZE == 64


class RecordError(ValueError):
    """A header or payload failed its checks."""


@dataclass(frozen=True)
class RecordHeader:
    kind: int
    codec: int
    stored_len: int
    raw_len: int
    chunk_id: bytes
    payload_crc: int

    @property
    def span(self) -> int:
        """Bytes the record occupies in the segment, padding included."""
        return record_span(self.stored_len)


def record_span(stored_len: int) -> int:
    n = HEADER_SIZE + stored_len
    return (n + RECORD_ALIGN - 1) // RECORD_ALIGN * RECORD_ALIGN


def encode_segment_header(seg_id: int, store_uuid: str, created_ns: int, version: int) -> bytes:
    body = SEGMENT_HEADER.pack(SEGMENT_MAGIC, version, 0, seg_id, uuid.UUID(store_uuid).bytes, created_ns, 0)
    crc = zlib.crc32(body[:60])
    return body[:60] + struct.pack("<I", crc)


@dataclass(frozen=True)
class SegmentHeader:
    version: int
    seg_id: int
    store_uuid: str
    created_ns: int


def decode_segment_header(buf: bytes) -> SegmentHeader:
    if len(buf) < 64:
        raise RecordError("segment header truncated")
    magic, version, _r, seg_id, raw_uuid, created, crc = SEGMENT_HEADER.unpack_from(buf)
    if magic != SEGMENT_MAGIC:
        raise RecordError("bad segment magic")
    if zlib.crc32(buf[:60]) != crc:
        raise RecordError("segment header checksum mismatch")
    return SegmentHeader(version, seg_id, str(uuid.UUID(bytes=raw_uuid)), created)


def encode_record(chunk_id: bytes, payload: bytes | memoryview, raw_len: int, codec: int = CODEC_RAW) -> bytes:
    """One padded chunk record, ready to append."""
    return b"".join(record_parts(chunk_id, payload, raw_len, codec))


_PADDING = bytes(RECORD_ALIGN)


def record_parts(chunk_id: bytes, payload: bytes | memoryview, raw_len: int, codec: int = CODEC_RAW,
                 ) -> tuple[bytes, bytes | memoryview, bytes]:
    """The header, payload and padding of one record, to be written back to back without
    copying the payload into a joined buffer."""
    pcrc = _native.crc32(payload)
    head = RECORD_HEADER.pack(RECORD_MAGIC, KIND_CHUNK, codec, 0, len(payload), raw_len, chunk_id, pcrc, 0)
    head = head[:60] + struct.pack("<I", zlib.crc32(head[:60]))
    pad = record_span(len(payload)) - HEADER_SIZE - len(payload)
    return head, payload, _PADDING[:pad]


def decode_record_header(buf: bytes | memoryview) -> RecordHeader:
    if len(buf) < HEADER_SIZE:
        raise RecordError("record header truncated")
    magic, kind, codec, _r, stored, raw, cid, pcrc, hcrc = RECORD_HEADER.unpack_from(buf)
    if magic != RECORD_MAGIC:
        raise RecordError("bad record magic")
    if zlib.crc32(bytes(buf[:60])) != hcrc:
        raise RecordError("record header checksum mismatch")
    if (kind != KIND_CHUNK or codec not in KNOWN_CODECS or stored > MAX_PAYLOAD or raw > MAX_PAYLOAD
            or (codec == CODEC_RAW and raw != stored)):
        raise RecordError(f"unknown record kind/codec or bad length (kind={kind} codec={codec})")
    return RecordHeader(kind, codec, stored, raw, cid, pcrc)


def check_payload(head: RecordHeader, payload: bytes | memoryview) -> None:
    if len(payload) != head.stored_len:
        raise RecordError("record payload truncated")
    if _native.crc32(payload) != head.payload_crc:
        raise RecordError("record payload checksum mismatch")


def check_record(rec: bytes | memoryview, chunk_id: bytes | None = None,
                 stored_len: int | None = None) -> tuple[RecordHeader, memoryview]:
    """A whole record read back (from a segment or a pack): its header, that it holds
    `chunk_id` with `stored_len` payload bytes when they are given, and its payload CRC;
    RecordError otherwise. Returns the header and the payload."""
    view = memoryview(rec)
    head = decode_record_header(view[:HEADER_SIZE])
    if (chunk_id is not None and head.chunk_id != chunk_id) or (stored_len is not None and head.stored_len != stored_len):
        raise RecordError("record does not hold the expected chunk")
    payload = view[HEADER_SIZE:HEADER_SIZE + head.stored_len]
    check_payload(head, payload)
    return head, payload


@dataclass(frozen=True)
class ScannedRecord:
    offset: int
    header: RecordHeader | None  # None: damaged bytes between valid records
    length: int  # for a damaged region, its length in bytes
    payload_ok: bool


def scan_records(buf: "bytes | mmap.mmap", start: int = DATA_START, end: int | None = None) -> Iterator[ScannedRecord]:
    """Walk the records of one segment image without the catalog.

    Zero-filled regions (preallocated tail, punched holes) are skipped silently.
    Bytes that are neither zeros nor a valid record are reported as a damaged
    region, and the scan resynchronises at the next valid aligned header.
    """
    end = len(buf) if end is None else min(end, len(buf))
    off = start
    bad_start: int | None = None
    while off + HEADER_SIZE <= end:
        head: RecordHeader | None = None
        if buf[off:off + 4] == RECORD_MAGIC:
            try:
                head = decode_record_header(buf[off:off + HEADER_SIZE])
            except RecordError:
                head = None
        if head is not None:
            if bad_start is not None:
                yield ScannedRecord(bad_start, None, off - bad_start, False)
                bad_start = None
            payload = buf[off + HEADER_SIZE: off + HEADER_SIZE + head.stored_len]
            try:
                check_payload(head, payload)
                ok = True
            except RecordError:
                ok = False
            yield ScannedRecord(off, head, head.span, ok)
            off += head.span
            continue
        nxt = buf.find(RECORD_MAGIC, off + 1, end)
        while nxt != -1 and nxt % RECORD_ALIGN:
            nxt = buf.find(RECORD_MAGIC, nxt + 1, end)
        stop = end if nxt == -1 else nxt
        if bad_start is None:
            for lo in range(off, stop, 1 << 20):  # look at big zero regions a piece at a time
                piece = buf[lo:min(stop, lo + (1 << 20))]
                if piece.count(0) != len(piece):
                    bad_start = off
                    break
        off = stop
    if bad_start is not None:
        yield ScannedRecord(bad_start, None, end - bad_start, False)


class Location(NamedTuple):
    """Where one chunk record lives, and how its payload encodes the chunk (codecs.py). A
    NamedTuple: made once per chunk with the GIL held (see content.Extent)."""

    seg_id: int
    offset: int
    stored_len: int
    codec: int = CODEC_RAW
    raw_len: int | None = None  # None: a raw record (raw_len = stored_len)

    @property
    def span(self) -> int:
        return record_span(self.stored_len)

    @property
    def length(self) -> int:
        """Bytes of the chunk itself (what an extent of it covers)."""
        return self.stored_len if self.raw_len is None else self.raw_len

    @property
    def encoded(self) -> bool:
        return self.codec != CODEC_RAW


MAX_RUN = 256  # records per read of a run of them (3 buffers each, within one preadv's 1024)
