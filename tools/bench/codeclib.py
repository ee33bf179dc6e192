"""Candidate piece codecs and delta transforms for tools/bench/codecs.py.

A piece is a uint8 numpy array and an element size (2 for bf16, 4 for fp32); a coder
turns it into a blob and back. A piece costs min(blob, raw) bytes: a blob that does not
shrink the piece is stored raw (cowfs.store.log.codecs does the same).

"engine" is cowfs.store.log.codecs itself (Blosc2 SHUFFLE + ZSTD at its CLEVEL, one thread,
raw when not smaller; its delta payload carries the 32-byte base id). The others are
candidates the engine does not use: Blosc2 with SHUFFLE or BITSHUFFLE and ZSTD 1/3 or LZ4,
numcodecs Shuffle + Zstd, zipnn, and plain zstd with no grouping.

A delta transform turns (piece, base piece) into a residual of the same size:
  xor   piece ^ base (cowfs.store.log.codecs.xor_bytes); symmetric, so the delta of version i
        against i+1 is the same bytes as that of i+1 against i;
  sub   zigzag(piece - base) on signed integers of the element size: small differences of
        either sign give small values (high bytes 0), even across an exponent boundary.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable

import blosc2
import numcodecs
import numpy as np
import zstandard

from cowfs.store.log import codecs as engine

SINT = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}
UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


# ---- transforms -------------------------------------------------------------------------

def xor(piece: np.ndarray, base: np.ndarray, size: int) -> np.ndarray:
    return engine.xor_bytes(piece, base)


def sub(piece: np.ndarray, base: np.ndarray, size: int) -> np.ndarray:
    if size not in SINT:
        return xor(piece, base, size)
    d = piece.view(SINT[size]) - base.view(SINT[size])  # wraps, undone by wrapping
    return ((d << 1) ^ (d >> (8 * size - 1))).view(np.uint8)


def unsub(resid: np.ndarray, base: np.ndarray, size: int) -> np.ndarray:
    if size not in SINT:
        return xor(resid, base, size)
    z = resid.view(UINT[size])
    d = (z >> 1).view(SINT[size]) ^ -(z & 1).view(SINT[size])
    return (d + base.view(SINT[size])).view(np.uint8)


@dataclass(frozen=True)
class Transform:
    name: str
    forward: Callable[[np.ndarray, np.ndarray, int], np.ndarray]
    inverse: Callable[[np.ndarray, np.ndarray, int], np.ndarray]


TRANSFORMS = {"xor": Transform("xor", xor, xor), "sub": Transform("sub", sub, unsub)}


# ---- coders -----------------------------------------------------------------------------

@dataclass
class Coder:
    """encode(piece, element size) -> blob; decode(blob, element size, raw length) -> piece."""
    name: str
    encode: Callable[[np.ndarray, int], bytes]
    decode: Callable[[bytes, int, int], np.ndarray]
    note: str = ""
    lib_threads: bool = False  # the library can spread one piece over its own threads
    blosc2: bool = False  # runs in Blosc2 (whose GIL release is a process-wide switch)
    set_threads: Callable[[int], None] = field(default=lambda n: None)
    # the engine's own delta path ((codec, payload) = encode_delta(piece, size, base)),
    # used instead of a transform + encode when set (xor only)
    encode_delta: Callable[[np.ndarray, int, np.ndarray], tuple[int, bytes]] | None = None
    decode_delta: Callable[[int, bytes, int, int, np.ndarray], np.ndarray] | None = None


def engine_coder() -> Coder:
    """cowfs.store.log.codecs as the engine calls it. Whole: encode_whole (the payload is the
    raw piece when grouping does not shrink it). Delta: encode_delta, which stores the
    base id and the XOR, or the whole encoding when that is smaller (the engine's choice)."""
    def enc(buf: np.ndarray, size: int) -> bytes:
        return engine.encode_whole(buf, size).payload

    def dec(blob: bytes, size: int, n: int) -> np.ndarray:
        codec = engine.CODEC_RAW if len(blob) == n else engine.CODEC_GROUPED
        return np.frombuffer(engine.decode(codec, blob, n, lambda i: b""), np.uint8)

    def enc_delta(buf: np.ndarray, size: int, base: np.ndarray) -> tuple[int, bytes]:
        e = engine.encode_delta(buf, size, ENGINE_BASE_ID, base)
        return e.codec, e.payload

    def dec_delta(codec: int, blob: bytes, size: int, n: int, base: np.ndarray) -> np.ndarray:
        return np.frombuffer(engine.decode(codec, blob, n, lambda i: base), np.uint8)

    return Coder(f"engine: shuffle+zstd-{engine.CLEVEL}", enc, dec, "cowfs.store.log.codecs, nthreads=1",
                 blosc2=True, encode_delta=enc_delta, decode_delta=dec_delta)


ENGINE_BASE_ID = bytes(engine.ID_SIZE)  # the base's chunk id: its value does not change sizes


def blosc2_coder(label: str, filt: blosc2.Filter, codec: blosc2.Codec, clevel: int,
                 typesize: int | None = None, **tuning: object) -> Coder:
    """`tuning`: more Blosc2 cparams (blocksize, splitmode) and `then`, a filter after `filt`."""
    state = {"nthreads": 1}
    then = tuning.pop("then", None)
    filters = [filt] + ([then] if then is not None else [])

    def enc(buf: np.ndarray, size: int) -> bytes:
        ts = typesize or (size if size <= engine.MAX_TYPESIZE else 1)
        return blosc2.compress2(buf, typesize=ts, clevel=clevel, codec=codec, filters=filters,
                                filters_meta=[0] * len(filters), nthreads=state["nthreads"], **tuning)

    def dec(blob: bytes, size: int, n: int) -> np.ndarray:
        return np.frombuffer(blosc2.decompress2(blob, nthreads=state["nthreads"]), np.uint8)

    def set_threads(n: int) -> None:
        state["nthreads"] = n

    note = f"blosc2 {blosc2.__version__}" + (f", typesize {typesize}" if typesize else "")
    return Coder(label, enc, dec, note, True, True, set_threads)


def numcodecs_coder(level: int) -> Coder:
    zstd = numcodecs.Zstd(level=level)
    shufflers: dict[int, numcodecs.Shuffle] = {}

    def shuffler(size: int) -> numcodecs.Shuffle:
        if size not in shufflers:
            shufflers[size] = numcodecs.Shuffle(elementsize=size)
        return shufflers[size]

    def enc(buf: np.ndarray, size: int) -> bytes:
        return bytes(zstd.encode(shuffler(size).encode(buf)))

    def dec(blob: bytes, size: int, n: int) -> np.ndarray:
        return np.frombuffer(shuffler(size).decode(zstd.decode(blob)), np.uint8)

    return Coder(f"numcodecs shuffle+zstd-{level}", enc, dec, f"numcodecs {numcodecs.__version__}")


_local = threading.local()  # zstandard (de)compressors are not thread safe: one per thread


def zstd_coder(level: int) -> Coder:
    def enc(buf: np.ndarray, size: int) -> bytes:
        cache = _local.__dict__.setdefault("c", {})
        if level not in cache:
            cache[level] = zstandard.ZstdCompressor(level=level)
        return cache[level].compress(buf)

    def dec(blob: bytes, size: int, n: int) -> np.ndarray:
        if not hasattr(_local, "d"):
            _local.d = zstandard.ZstdDecompressor()
        return np.frombuffer(_local.d.decompress(blob, max_output_size=n), np.uint8)

    return Coder(f"zstd-{level}, no grouping", enc, dec, f"zstandard {zstandard.__version__}")


def zipnn_coder() -> Coder | None:
    """zipnn on byte input. zipnn 0.5.4 overwrites its input buffer (even a bytes object)
    while compressing, so it is given a fresh copy every time. Its package imports torch."""
    try:
        from zipnn import ZipNN
    except ImportError:
        return None
    dtypes = {2: "bfloat16", 4: "float32"}
    cache: dict[tuple[int, int, int], object] = {}
    state = {"threads": 1}
    fallback = zstd_coder(3)

    def get(size: int) -> object:
        key = (size, state["threads"], threading.get_ident())
        if key not in cache:
            cache[key] = ZipNN(input_format="byte", bytearray_dtype=dtypes[size], threads=state["threads"])
        return cache[key]

    def enc(buf: np.ndarray, size: int) -> bytes:
        if size not in dtypes:  # zipnn has no integer modes here
            return fallback.encode(buf, size)
        return bytes(get(size).compress(buf.tobytes()))

    def dec(blob: bytes, size: int, n: int) -> np.ndarray:
        if size not in dtypes:
            return fallback.decode(blob, size, n)
        return np.frombuffer(bytes(get(size).decompress(blob)), np.uint8)

    def set_threads(n: int) -> None:
        state["threads"] = n

    import zipnn
    version = getattr(zipnn, "__version__", "?")
    return Coder("zipnn", enc, dec, f"zipnn {version} (AUTO; imports torch)", True, set_threads=set_threads)


def all_coders() -> dict[str, Coder]:
    F, C = blosc2.Filter, blosc2.Codec
    coders = [engine_coder()]
    for fname, filt in (("shuffle", F.SHUFFLE), ("bitshuffle", F.BITSHUFFLE)):
        for level in (1, 3):
            coders.append(blosc2_coder(f"blosc2 {fname}+zstd-{level}", filt, C.ZSTD, level))
        coders.append(blosc2_coder(f"blosc2 {fname}+lz4-5", filt, C.LZ4, 5))
    coders.append(blosc2_coder("blosc2 zstd-1, typesize 1 (no grouping)", F.SHUFFLE, C.ZSTD, 1, typesize=1))
    S = blosc2.SplitMode  # the engine's call with one Blosc2 setting changed
    coders += [blosc2_coder("blosc2 shuffle+zstd-1 blocks-1MiB", F.SHUFFLE, C.ZSTD, 1, blocksize=1 << 20),
               blosc2_coder("blosc2 shuffle+zstd-1 always-split", F.SHUFFLE, C.ZSTD, 1, splitmode=S.ALWAYS_SPLIT),
               blosc2_coder("blosc2 shuffle+zstd-1 never-split", F.SHUFFLE, C.ZSTD, 1, splitmode=S.NEVER_SPLIT),
               blosc2_coder("blosc2 shuffle+bytedelta+zstd-1", F.SHUFFLE, C.ZSTD, 1, then=F.BYTEDELTA)]
    coders += [numcodecs_coder(1), numcodecs_coder(3), zstd_coder(3)]
    z = zipnn_coder()
    if z is not None:
        coders.append(z)
    return {c.name: c for c in coders}


def stored_size(blob: bytes, raw_len: int) -> int:
    """What a piece costs: its blob, or the piece itself if the blob is not smaller."""
    return min(len(blob), raw_len)
