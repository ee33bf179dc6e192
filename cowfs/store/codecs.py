"""How a chunk's bytes are stored in its record: raw, byte-grouped and compressed, or as the
byte-grouped, compressed XOR against a base chunk (a delta). docs/format.md, section 3.

A chunk is identified by the BLAKE3 of its raw bytes whatever its encoding, so an encoding
can change (compaction re-encodes) without changing any extent. Byte grouping puts byte 0
of every element together, then byte 1, ...: the sign and exponent bytes of floats, which
successive checkpoints nearly share, then compress to little. Both steps run in Blosc2's C
code (SHUFFLE filter with typesize = element size, then ZSTD), which releases the GIL; the
XOR runs in numpy, which releases it too.

Payloads:
  CODEC_RAW      the raw bytes
  CODEC_GROUPED  a Blosc2 chunk of the raw bytes
  CODEC_XOR      the base chunk's id (32 bytes), then a Blosc2 chunk of raw XOR base
A delta's base has the same raw length. Decoding a delta needs the base's raw bytes, which
may themselves be a delta: the compactor bounds that chain (MAX_CHAIN pieces per read).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import blosc2
import numpy as np

from ..errors import CorruptData
from .records import CODEC_GROUPED, CODEC_RAW, CODEC_XOR

CODEC_NAMES = {CODEC_RAW: "raw", CODEC_GROUPED: "grouped", CODEC_XOR: "xor"}
ID_SIZE = 32
MAX_CHAIN = 4  # pieces a read of one piece may touch: itself and up to 3 bases
CLEVEL = 1  # ZSTD level (docs/benchmarks.md, "Checkpoint codecs")
MAX_TYPESIZE = 255  # Blosc2's limit for the shuffle's element size


@dataclass(frozen=True)
class Encoded:
    codec: int
    payload: bytes
    base: bytes | None = None  # CODEC_XOR: the id of the chunk it is a delta against

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


def encode_delta(raw: bytes | memoryview, elem_size: int, base_id: bytes, base_raw: bytes | memoryview) -> Encoded:
    """The XOR against `base_raw`, grouped and compressed; the whole encoding when that is
    smaller (a base that shares little), raw when nothing shrinks."""
    packed = _grouped(xor_bytes(raw, base_raw), elem_size)
    whole = encode_whole(raw, elem_size)
    if ID_SIZE + len(packed) < whole.stored_len:
        return Encoded(CODEC_XOR, base_id + packed, base_id)
    return whole


def base_of(codec: int, payload: bytes | memoryview) -> bytes | None:
    """The id of the chunk a payload is a delta against (None unless CODEC_XOR)."""
    if codec != CODEC_XOR:
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
    if codec == CODEC_XOR:
        base_id = base_of(codec, payload)
        assert base_id is not None
        base = base_raw(base_id)
        if len(base) != raw_len:
            raise CorruptData(f"delta base {base_id.hex()[:16]} has {len(base)} bytes, {raw_len} expected")
        out = np.frombuffer(bytearray(_unpack(payload[ID_SIZE:], raw_len)), np.uint8)
        np.bitwise_xor(out, np.frombuffer(base, np.uint8), out=out)
        return memoryview(out.data).cast("B")
    raise CorruptData(f"unknown codec {codec}")


def _unpack(packed: bytes | memoryview, raw_len: int) -> bytes:
    try:
        raw = blosc2.decompress2(bytes(packed) if isinstance(packed, memoryview) else packed)
    except Exception as e:  # Blosc2 raises RuntimeError/ValueError on damaged chunks
        raise CorruptData(f"compressed payload does not decode ({e})") from None
    if len(raw) != raw_len:
        raise CorruptData(f"compressed payload decodes to {len(raw)} bytes, {raw_len} expected")
    return raw
