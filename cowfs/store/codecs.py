"""How a chunk's bytes are stored in its record: raw, byte-grouped and compressed, or as a
byte-grouped, compressed difference against a base chunk (a delta: element-wise subtraction,
or XOR for odd element sizes). docs/format.md, section 3.2.

A chunk is identified by the BLAKE3 of its raw bytes whatever its encoding, so an encoding
can change (compaction re-encodes) without changing any extent. Byte grouping puts byte 0
of every element together, then byte 1, ...: the sign and exponent bytes of floats, which
successive checkpoints nearly share, then compress to little. Both steps run in Blosc2's C
code (SHUFFLE filter with typesize = element size, then ZSTD), which releases the GIL once
`blosc2.set_releasegil(True)` is called (below; its default holds it, so worker threads
would not run in parallel); the differences run in numpy, which releases it too.

Payloads:
  CODEC_RAW      the raw bytes
  CODEC_GROUPED  a Blosc2 chunk of the raw bytes
  CODEC_XOR      the base chunk's id (32 bytes), then a Blosc2 chunk of raw XOR base
  CODEC_SUB      the base chunk's id (32 bytes), then a Blosc2 chunk of zigzag(raw - base),
                 elements as little-endian signed integers of the element size, wrapping
A delta's base has the same raw length. Decoding a delta needs the base's raw bytes, which
may themselves be a delta: the compactor bounds that chain (MAX_CHAIN records per read).
Subtraction beats XOR on checkpoints (docs/benchmarks.md, "Checkpoint codecs"): a small
change of a float changes the low bits of its integer image by a small amount, which XOR
turns into flipped bits above it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import blosc2
import numpy as np

from ..errors import CorruptData
from .records import CODEC_GROUPED, CODEC_RAW, CODEC_SUB, CODEC_XOR

blosc2.set_releasegil(True)  # compression and decompression release the GIL (worker threads scale)

CODEC_NAMES = {CODEC_RAW: "raw", CODEC_GROUPED: "grouped", CODEC_XOR: "xor", CODEC_SUB: "sub"}
DELTA_CODECS = (CODEC_XOR, CODEC_SUB)
ID_SIZE = 32
MAX_CHAIN = 4  # records a read of one piece may touch: itself and up to 3 bases
_INTS = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}
_UINTS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
CLEVEL = 1  # ZSTD level (docs/benchmarks.md, "Checkpoint codecs")
MAX_TYPESIZE = 255  # Blosc2's limit for the shuffle's element size


@dataclass(frozen=True)
class Encoded:
    codec: int
    payload: bytes
    base: bytes | None = None  # a delta: the id of the chunk it is a delta against

    @property
    def stored_len(self) -> int:
        return len(self.payload)


def _grouped(data: bytes | memoryview, elem_size: int) -> bytes:
    typesize = elem_size if 1 <= elem_size <= MAX_TYPESIZE else 1
    return blosc2.compress2(data, typesize=typesize, clevel=CLEVEL, filters=[blosc2.Filter.SHUFFLE],
                            codec=blosc2.Codec.ZSTD, nthreads=1)


def xor_bytes(a: bytes | memoryview, b: bytes | memoryview) -> np.ndarray:
    """a XOR b (same length), as uint8 (computed 8 bytes at a time where the length allows)."""
    n = len(a)
    if len(b) != n:
        raise ValueError(f"xor of {n} and {len(b)} bytes")
    wide = n - n % 8
    out = np.empty(n, np.uint8)
    if wide:
        np.bitwise_xor(np.frombuffer(a, np.uint64, wide // 8), np.frombuffer(b, np.uint64, wide // 8),
                       out=out[:wide].view(np.uint64))
    if n > wide:
        np.bitwise_xor(np.frombuffer(a, np.uint8, n - wide, wide), np.frombuffer(b, np.uint8, n - wide, wide),
                       out=out[wide:])
    return out


def encode_whole(raw: bytes | memoryview, elem_size: int) -> Encoded:
    """Grouped and compressed, or raw when that does not shrink it."""
    packed = _grouped(raw, elem_size)
    if len(packed) < len(raw):
        return Encoded(CODEC_GROUPED, packed)
    return Encoded(CODEC_RAW, bytes(raw))


def sub_bytes(a: bytes | memoryview, b: bytes | memoryview, elem_size: int) -> np.ndarray:
    """zigzag(a - b) per element (signed, wrapping), as bytes of the same length."""
    it = _INTS[elem_size]
    d = np.frombuffer(a, it) - np.frombuffer(b, it)
    d = (d << 1) ^ (d >> (8 * elem_size - 1))
    return d.view(np.uint8)


def add_back(z: np.ndarray, base: bytes | memoryview, elem_size: int) -> np.ndarray:
    """The inverse of sub_bytes: base + unzigzag(z), in place in `z`."""
    it = _INTS[elem_size]
    u = z.view(_UINTS[elem_size])
    d = (u >> 1).view(it) ^ -(u & 1).view(it)
    np.add(d, np.frombuffer(base, it), out=d)
    return d.view(np.uint8)


def can_subtract(length: int, elem_size: int) -> bool:
    return elem_size in _INTS and length % elem_size == 0


def encode_delta(raw: bytes | memoryview, elem_size: int, base_id: bytes, base_raw: bytes | memoryview,
                 beat: int) -> Encoded | None:
    """The difference against `base_raw` (subtraction per element where the length allows,
    XOR otherwise), grouped and compressed; None unless it is smaller than `beat` bytes (the
    chunk's present record)."""
    if len(raw) != len(base_raw):
        raise ValueError(f"delta of {len(raw)} bytes against {len(base_raw)}")
    if can_subtract(len(raw), elem_size):
        codec, diff = CODEC_SUB, sub_bytes(raw, base_raw, elem_size)
    else:
        codec, diff = CODEC_XOR, xor_bytes(raw, base_raw)
    packed = _grouped(diff, elem_size)
    if ID_SIZE + len(packed) >= beat:
        return None
    return Encoded(codec, base_id + packed, base_id)


def base_of(codec: int, payload: bytes | memoryview) -> bytes | None:
    """The id of the chunk a payload is a delta against (None unless a delta codec)."""
    if codec not in DELTA_CODECS:
        return None
    if len(payload) < ID_SIZE:
        raise CorruptData("delta payload shorter than its base id")
    return bytes(payload[:ID_SIZE])


def decode(codec: int, payload: bytes | memoryview, raw_len: int,
           base_raw: Callable[[bytes], bytes | memoryview]) -> bytes | memoryview:
    """The raw bytes of a record's payload. `base_raw(id)` gives a base chunk's raw bytes
    (verified by the caller). Malformed payloads raise CorruptData; the caller checks the
    result against the chunk id (BLAKE3), so a damaged base never yields wrong bytes."""
    if codec == CODEC_RAW:
        if len(payload) != raw_len:
            raise CorruptData(f"raw payload of {len(payload)} bytes, {raw_len} expected")
        return payload
    if codec == CODEC_GROUPED:
        return _unpack(payload, raw_len)
    if codec in DELTA_CODECS:
        base_id = base_of(codec, payload)
        assert base_id is not None
        base = base_raw(base_id)
        if len(base) != raw_len:
            raise CorruptData(f"delta base {base_id.hex()[:16]} has {len(base)} bytes, {raw_len} expected")
        packed = payload[ID_SIZE:]
        out = np.frombuffer(bytearray(_unpack(packed, raw_len)), np.uint8)
        if codec == CODEC_XOR:
            np.bitwise_xor(out, np.frombuffer(base, np.uint8), out=out)
        else:
            elem = _typesize(packed)
            if not can_subtract(raw_len, elem):
                raise CorruptData(f"subtraction delta with element size {elem} for {raw_len} bytes")
            out = add_back(out, base, elem)
        return memoryview(out.data).cast("B")
    raise CorruptData(f"unknown codec {codec}")


def _typesize(packed: bytes | memoryview) -> int:
    """The element size a Blosc2 chunk was shuffled with (its header's byte 3)."""
    if len(packed) < 16:
        raise CorruptData("compressed payload shorter than its header")
    return int(packed[3])


def _unpack(packed: bytes | memoryview, raw_len: int) -> bytes:
    try:
        raw = blosc2.decompress2(bytes(packed) if isinstance(packed, memoryview) else packed)
    except Exception as e:  # Blosc2 raises RuntimeError/ValueError on damaged chunks
        raise CorruptData(f"compressed payload does not decode ({e})") from None
    if len(raw) != raw_len:
        raise CorruptData(f"compressed payload decodes to {len(raw)} bytes, {raw_len} expected")
    return raw
