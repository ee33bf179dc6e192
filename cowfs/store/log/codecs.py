"""How a chunk's bytes are stored in its record: raw, byte-grouped and compressed, or as a
byte-grouped, compressed difference against a base chunk (a delta: element-wise subtraction,
or XOR for odd element sizes). docs/format.md, section 3.2.

A chunk is identified by the BLAKE3 of its raw bytes whatever its encoding, so an encoding
can change (compaction re-encodes) without changing any extent. Byte grouping puts byte 0
of every element together, then byte 1, ...: the sign and exponent bytes of floats, which
successive checkpoints nearly share, then compress to little. Both steps run in Blosc2's C
code (SHUFFLE filter with typesize = element size, then ZSTD), which releases the GIL once
`blosc2.set_releasegil(True)` is called (`_blosc2`; its default holds it, so worker threads
would not run in parallel); the differences run in numpy (XOR) and in C (_native: the
subtraction and its inverse), which release it too.

Payloads:
  CODEC_RAW      the raw bytes
  CODEC_GROUPED  a Blosc2 chunk of the raw bytes
  CODEC_XOR      the base chunk's id (32 bytes), then a Blosc2 chunk of raw XOR base
  CODEC_SUB      the base chunk's id (32 bytes), then a Blosc2 chunk of zigzag(raw - base),
                 elements as little-endian signed integers of the element size, wrapping
  CODEC_FDELTA   the base chunk's id (32 bytes), then a float piece's difference from its
                 base, each element's bit length coded by rANS in the context of the
                 base element's exponent, the bits below it raw
                 (native/floatcodec.c; format.md 3.2.1). Floats only (bf16, f16, f32): the
                 tensor's dtype says where the exponent is. Four rANS states interleaved.
  CODEC_FDELTA32 the same with 32 states: what the encoder writes since format version 7
                 (a decoder steps eight of them at once in a vector register).
A delta's base has the same raw length. Decoding a delta needs the base's raw bytes, which
may themselves be a delta: the compactor bounds that chain (MAX_CHAIN records per read).
Subtraction beats XOR on checkpoints (docs/benchmarks.md, "Checkpoint codecs"): a small
change of a float changes the low bits of its integer image by a small amount, which XOR
turns into flipped bits above it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from ... import _native
from ...errors import CorruptData
from .records import CODEC_FDELTA, CODEC_FDELTA32, CODEC_GROUPED, CODEC_RAW, CODEC_SUB, CODEC_XOR

if TYPE_CHECKING:
    import numpy as np

_blosc2_module: Any = None  # imported at first use, as numpy is in the functions below: the
# CLI's commands import the store without encoding or decoding anything (0.05 s of start-up)


def load_libraries() -> None:
    """Import what decoding needs (numpy, Blosc2), so that a first decode does not wait for it."""
    import numpy  # noqa: F401

    _blosc2()


def _blosc2() -> Any:
    """Blosc2, imported at first use: it costs ~0.25 s of CPU (it pulls in httpx and rich), which
    every `cowfs` command would pay otherwise. Compression and decompression release the GIL
    from then on (worker threads scale)."""
    global _blosc2_module
    if _blosc2_module is None:
        import blosc2

        blosc2.set_releasegil(True)
        _blosc2_module = blosc2
    return _blosc2_module

# in `cowfs stats`: "fdelta" is the float delta the encoder writes, "fdelta4" its four-state
# form that stores upgraded from format 6 still hold
CODEC_NAMES = {CODEC_RAW: "raw", CODEC_GROUPED: "grouped", CODEC_XOR: "xor", CODEC_SUB: "sub", CODEC_FDELTA: "fdelta4",
               CODEC_FDELTA32: "fdelta"}
FDELTA_LANES = {CODEC_FDELTA: 4, CODEC_FDELTA32: 32}  # the float delta's codecs: rANS states interleaved
FDELTA_WRITTEN = CODEC_FDELTA32  # the one the encoder writes
DELTA_CODECS = (CODEC_XOR, CODEC_SUB, CODEC_FDELTA, CODEC_FDELTA32)
# float dtypes (safetensors names) the fdelta codec takes: (element size, mantissa bits, exponent bits)
FLOAT_FORMATS = {"BF16": (2, 7, 8), "F16": (2, 10, 5), "F32": (4, 23, 8)}
ID_SIZE = 32
DELTA_MAX_SHARE = 0.9  # a delta is kept only if at most this share of the piece's whole record:
# every read of the piece (and of older pieces leaning on it) decodes one more record for it,
# so a delta that saves little costs reads more than it saves space (docs/benchmarks.md)
SUB_SIZES = (1, 2, 4, 8)  # element sizes the subtraction delta handles
FDELTA_SURE = 0.25  # an fdelta at most this share of the raw piece is kept without trying Blosc2's
CLEVEL = 1  # ZSTD level (docs/benchmarks.md, "Checkpoint codecs")
# Blosc2's own threads per decompression: one. Its default (one per core) starts and joins them
# in every call: a 1 MiB piece took 572 CPU us with 1, 782 with 2, 1586 with 16 (2-core VM), and
# the readers and the compactor already decode many pieces at once on their own threads
DECODE_THREADS = 1
MAX_TYPESIZE = 255  # Blosc2's limit for the shuffle's element size


@dataclass(frozen=True)
class Encoded:
    codec: int
    payload: bytes | memoryview
    base: bytes | None = None  # a delta: the id of the chunk it is a delta against

    @property
    def stored_len(self) -> int:
        return len(self.payload)


def _grouped(data: bytes | memoryview, elem_size: int) -> bytes:
    typesize = elem_size if 1 <= elem_size <= MAX_TYPESIZE else 1
    blosc2 = _blosc2()
    return blosc2.compress2(data, typesize=typesize, clevel=CLEVEL, filters=[blosc2.Filter.SHUFFLE],
                            codec=blosc2.Codec.ZSTD, nthreads=1)


def xor_bytes(a: bytes | memoryview, b: bytes | memoryview) -> np.ndarray:
    """a XOR b (same length), as uint8 (computed 8 bytes at a time where the length allows)."""
    import numpy as np
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
    """zigzag(a - b) per element (signed, wrapping), as bytes of the same length (in C:
    _native.sub_zigzag, 20-50x numpy's temporaries, GIL released)."""
    import numpy as np
    out = np.empty(len(a), np.uint8)
    _native.sub_zigzag(a, b, out, elem_size)
    return out


def add_back(z: np.ndarray, base: bytes | memoryview, elem_size: int) -> None:
    """The inverse of sub_bytes, in place: z (uint8, the zigzag differences) becomes
    base + unzigzag(z)."""
    _native.add_unzigzag(z, base, elem_size)


def can_subtract(length: int, elem_size: int) -> bool:
    return elem_size in SUB_SIZES and length % elem_size == 0


FDELTA_FIRST, BLOSC_ONLY, FDELTA_ONLY = "fdelta first", "blosc only", "fdelta only"  # encode_delta's orders


def encode_delta(raw: bytes | memoryview, elem_size: int, base_id: bytes, base_raw: bytes | memoryview,
                 whole_len: int, dtype: str = "", order: str = FDELTA_FIRST) -> Encoded | None:
    """The difference against `base_raw`, the smaller of: for a float dtype of
    FLOAT_FORMATS, the context-modelled fdelta; the subtraction per element where the
    length allows, else XOR, grouped and compressed. None unless it takes at most
    DELTA_MAX_SHARE of `whole_len` (the bytes of the piece's whole record).

    `order` (the compactor's memory of what won for the tensor's last pieces):
    FDELTA_FIRST tries the fdelta, then Blosc2's unless the fdelta takes at most
    FDELTA_SURE of the piece; FDELTA_ONLY and BLOSC_ONLY try the other only when the one
    named is not small enough."""
    if len(raw) != len(base_raw):
        raise ValueError(f"delta of {len(raw)} bytes against {len(base_raw)}")
    limit = int(whole_len * DELTA_MAX_SHARE) - ID_SIZE
    fmt = FLOAT_FORMATS.get(dtype)
    if fmt is None or fmt[0] != elem_size or len(raw) % elem_size:
        return _blosc_delta(raw, elem_size, base_id, base_raw, limit)
    if order == BLOSC_ONLY:
        return _blosc_delta(raw, elem_size, base_id, base_raw, limit) or _fdelta(raw, fmt, base_id, base_raw, limit)
    best = _fdelta(raw, fmt, base_id, base_raw, limit)
    if best is not None:
        if order == FDELTA_ONLY or best.stored_len - ID_SIZE <= len(raw) * FDELTA_SURE:
            return best  # Blosc2's delta has never been seen to beat it there (docs/benchmarks.md)
        limit = best.stored_len - ID_SIZE - 1
    return _blosc_delta(raw, elem_size, base_id, base_raw, limit) or best


def _fdelta(raw: bytes | memoryview, fmt: tuple[int, int, int], base_id: bytes, base_raw: bytes | memoryview,
            limit: int) -> Encoded | None:
    """The fdelta record, if its payload (past the base id) takes at most `limit` bytes."""
    if limit <= 0:
        return None
    packed = _native.fdelta_encode(raw, base_raw, *fmt, limit, FDELTA_LANES[FDELTA_WRITTEN])
    return Encoded(FDELTA_WRITTEN, base_id + packed, base_id) if packed is not None else None


def _blosc_delta(raw: bytes | memoryview, elem_size: int, base_id: bytes, base_raw: bytes | memoryview,
                 limit: int) -> Encoded | None:
    """Blosc2's subtraction (or XOR) delta, if its payload past the base id takes at most `limit` bytes."""
    if limit <= 0:
        return None
    if can_subtract(len(raw), elem_size):
        codec, diff = CODEC_SUB, sub_bytes(raw, base_raw, elem_size)
    else:
        codec, diff = CODEC_XOR, xor_bytes(raw, base_raw)
    packed = _grouped(diff, elem_size)
    return Encoded(codec, base_id + packed, base_id) if len(packed) <= limit else None


def base_of(codec: int, payload: bytes | memoryview) -> bytes | None:
    """The id of the chunk a payload is a delta against (None unless a delta codec)."""
    if codec not in DELTA_CODECS:
        return None
    if len(payload) < ID_SIZE:
        raise CorruptData("delta payload shorter than its base id")
    return bytes(payload[:ID_SIZE])


def decode(codec: int, payload: bytes | memoryview, raw_len: int,
           base_raw: Callable[[bytes], bytes | memoryview]) -> bytes | memoryview:
    """The raw bytes of a record's payload, in a new buffer (see decode_into)."""
    if codec == CODEC_RAW:
        if len(payload) != raw_len:
            raise CorruptData(f"raw payload of {len(payload)} bytes, {raw_len} expected")
        return payload
    out = memoryview(bytearray(raw_len))
    decode_into(codec, payload, out, base_raw)
    return out


def decode_into(codec: int, payload: bytes | memoryview, dest: memoryview,
                base_raw: Callable[[bytes], bytes | memoryview]) -> None:
    """Write the raw bytes of a record's payload into `dest` (its raw length): the
    decompressor writes straight into it and a delta adds its base in place, so a read
    decodes into its window without a copy. `base_raw(id)` gives a base chunk's raw bytes.
    Malformed payloads raise CorruptData; the caller checks `dest` against the chunk id
    (BLAKE3), so a damaged base never yields wrong bytes."""
    import numpy as np
    raw_len = len(dest)
    if codec == CODEC_RAW:
        if len(payload) != raw_len:
            raise CorruptData(f"raw payload of {len(payload)} bytes, {raw_len} expected")
        dest[:] = payload
        return
    if codec == CODEC_GROUPED:
        _unpack_into(payload, dest)
        return
    if codec not in DELTA_CODECS:
        raise CorruptData(f"unknown codec {codec}")
    base_id = base_of(codec, payload)
    assert base_id is not None
    base = base_raw(base_id)
    if len(base) != raw_len:
        raise CorruptData(f"delta base {base_id.hex()[:16]} has {len(base)} bytes, {raw_len} expected")
    packed = memoryview(payload)[ID_SIZE:]
    lanes = FDELTA_LANES.get(codec)
    if lanes is not None:
        try:
            _native.fdelta_decode(packed, base, dest, lanes)
        except ValueError as e:
            raise CorruptData(str(e)) from None
        return
    out = _unpack_into(packed, dest)
    if codec == CODEC_XOR:
        np.bitwise_xor(out, np.frombuffer(base, np.uint8), out=out)
        return
    elem = _typesize(packed)
    if not can_subtract(raw_len, elem):
        raise CorruptData(f"subtraction delta with element size {elem} for {raw_len} bytes")
    add_back(out, base, elem)


def _typesize(packed: bytes | memoryview) -> int:
    """The element size a Blosc2 chunk was shuffled with (its header's byte 3)."""
    if len(packed) < 16:
        raise CorruptData("compressed payload shorter than its header")
    return int(packed[3])


def _unpack_into(packed: bytes | memoryview, dest: memoryview) -> np.ndarray:
    """Decompress a Blosc2 chunk into `dest`, which its header must say it fills exactly;
    `dest` as a uint8 array."""
    import numpy as np
    blosc2 = _blosc2()
    try:
        nbytes, cbytes, _block = blosc2.get_cbuffer_sizes(packed)
    except Exception as e:
        raise CorruptData(f"compressed payload has a bad header ({e})") from None
    if nbytes != len(dest) or cbytes != len(packed):
        raise CorruptData(f"compressed payload of {len(packed)} bytes says {cbytes} bytes decoding to {nbytes},"
                          f" {len(dest)} expected")
    out = np.frombuffer(dest, np.uint8)
    if nbytes == 0:  # Blosc2 will not write into an empty destination
        return out
    try:
        blosc2.decompress2(packed, dst=out, nthreads=DECODE_THREADS)
    except Exception as e:  # Blosc2 raises RuntimeError/ValueError on damaged chunks
        raise CorruptData(f"compressed payload does not decode ({e})") from None
    return out
