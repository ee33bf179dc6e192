"""Candidate piece codecs for tools/bench/codecs.py: raw bytes + element size in, bytes out.

No torch: a piece is a uint8 numpy view; bf16 is handled as 2-byte elements. Every coder
here calls into libraries that release the GIL for the heavy part (zstandard, blosc2,
numpy copies and ufuncs), except zipnn, whose Python package imports torch (measured for
reference only: a daemon that may not import torch cannot use it as packaged).

A delta transform turns (piece, base piece) into a residual of the same size:
  xor   piece ^ base (bytewise; symmetric, so a delta against the next version is the same
        bytes as the next version's delta against this one);
  sub   (piece - base) on unsigned ints of the element size, zigzag-free (wraps);
  zz    zigzag(piece - base) on signed ints of the element size: small differences of
        either sign give small unsigned values (high bytes 0), even across an exponent
        boundary, where XOR flips many bits.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import zstandard

try:
    import blosc2
except ImportError:  # pragma: no cover - optional
    blosc2 = None

UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
SINT = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}
BITS = {1: 8, 2: 16, 4: 32, 8: 64}


# ---- transforms -------------------------------------------------------------------------

def _elems(buf: np.ndarray, size: int, signed: bool = False) -> np.ndarray:
    return buf.view((SINT if signed else UINT)[size])


def xor(piece: np.ndarray, base: np.ndarray, size: int) -> np.ndarray:
    return np.bitwise_xor(piece, base)


def sub(piece: np.ndarray, base: np.ndarray, size: int) -> np.ndarray:
    return (_elems(piece, size) - _elems(base, size)).view(np.uint8)


def unsub(resid: np.ndarray, base: np.ndarray, size: int) -> np.ndarray:
    return (_elems(resid, size) + _elems(base, size)).view(np.uint8)


def zz(piece: np.ndarray, base: np.ndarray, size: int) -> np.ndarray:
    d = _elems(piece, size, True) - _elems(base, size, True)  # wraps; fine, it is undone by wrapping
    z = (d << 1) ^ (d >> (BITS[size] - 1))
    return z.view(np.uint8)


def unzz(resid: np.ndarray, base: np.ndarray, size: int) -> np.ndarray:
    z = _elems(resid, size)
    d = (z >> 1).view(SINT[size]) ^ -(z & 1).view(SINT[size])
    return (d + _elems(base, size, True)).view(np.uint8)


@dataclass(frozen=True)
class Transform:
    name: str
    forward: Callable[[np.ndarray, np.ndarray, int], np.ndarray]
    inverse: Callable[[np.ndarray, np.ndarray, int], np.ndarray]


TRANSFORMS = {
    "xor": Transform("xor", xor, xor),
    "sub": Transform("sub", sub, unsub),
    "zz": Transform("zz", zz, unzz),
}


# ---- coders -----------------------------------------------------------------------------

def group(buf: np.ndarray, size: int) -> np.ndarray:
    """Byte grouping: all bytes 0 of the elements, then all bytes 1, ... (a transpose)."""
    if size == 1:
        return buf
    return np.ascontiguousarray(buf.reshape(-1, size).T)


def ungroup(buf: np.ndarray, size: int) -> np.ndarray:
    if size == 1:
        return buf
    return np.ascontiguousarray(buf.reshape(size, -1).T).reshape(-1)


@dataclass
class Coder:
    """encode(piece uint8, element size) -> blob; decode(blob, element size, nbytes) -> uint8.
    A blob that is not smaller than the piece is counted (and would be stored) raw."""
    name: str
    encode: Callable[[np.ndarray, int], bytes]
    decode: Callable[[bytes, int, int], np.ndarray]
    note: str = ""
    internal_threads: bool = False  # the library can split one piece over threads itself
    set_threads: Callable[[int], None] = field(default=lambda n: None)


_local = threading.local()  # zstandard (de)compressor objects are not thread safe: one per thread


def _zstd(level: int) -> zstandard.ZstdCompressor:
    cache = _local.__dict__.setdefault("c", {})
    if level not in cache:
        cache[level] = zstandard.ZstdCompressor(level=level)
    return cache[level]


def _zd() -> zstandard.ZstdDecompressor:
    if not hasattr(_local, "d"):
        _local.d = zstandard.ZstdDecompressor()
    return _local.d


def zstd_coder(level: int) -> Coder:
    def enc(buf: np.ndarray, size: int) -> bytes:
        return _zstd(level).compress(buf)

    def dec(blob: bytes, size: int, n: int) -> np.ndarray:
        return np.frombuffer(_zd().decompress(blob, max_output_size=n), np.uint8)

    return Coder(f"zstd-{level}", enc, dec, "no grouping")


def grouped_zstd_coder(level: int) -> Coder:
    def enc(buf: np.ndarray, size: int) -> bytes:
        return _zstd(level).compress(group(buf, size))

    def dec(blob: bytes, size: int, n: int) -> np.ndarray:
        return ungroup(np.frombuffer(_zd().decompress(blob, max_output_size=n), np.uint8), size)

    return Coder(f"np-group+zstd-{level}", enc, dec, "numpy transpose, one zstd frame")


def planes_coder(levels: dict[int, int], default: int, label: str) -> Coder:
    """Group, then code each byte plane as its own zstd frame at its own level (keyed by
    the byte's position counted from the most significant byte: 0 = sign/exponent);
    level 0 = store the plane raw; a plane that does not shrink is stored raw (1 flag byte
    + a 4-byte length per plane)."""
    def enc(buf: np.ndarray, size: int) -> bytes:
        g = group(buf, size).reshape(size, -1)
        out = bytearray()
        for b in range(size):
            plane = g[b]
            level = levels.get(size - 1 - b, default)
            blob = _zstd(level).compress(plane) if level else b""
            if not level or len(blob) >= plane.nbytes:
                out += b"\0" + plane.nbytes.to_bytes(4, "little") + plane.tobytes()
            else:
                out += b"\1" + len(blob).to_bytes(4, "little") + blob
        return bytes(out)

    def dec(blob: bytes, size: int, n: int) -> np.ndarray:
        planes, pos, mv = [], 0, memoryview(blob)
        for _ in range(size):
            flag, ln = mv[pos], int.from_bytes(mv[pos + 1:pos + 5], "little")
            body = mv[pos + 5:pos + 5 + ln]
            planes.append(np.frombuffer(_zd().decompress(body, max_output_size=n // size) if flag else body,
                                        np.uint8))
            pos += 5 + ln
        return ungroup(np.concatenate(planes), size)

    return Coder(label, enc, dec, "byte planes coded separately, raw if not shrinking")


def blosc2_coder(label: str, filters: list, codec, clevel: int) -> Coder:
    state = {"nthreads": 1}

    def enc(buf: np.ndarray, size: int) -> bytes:
        return blosc2.compress2(buf, typesize=size, clevel=clevel, codec=codec,
                                filters=filters, filters_meta=[0] * len(filters),
                                nthreads=state["nthreads"])

    def dec(blob: bytes, size: int, n: int) -> np.ndarray:
        return np.frombuffer(blosc2.decompress2(blob, nthreads=state["nthreads"]), np.uint8)

    def set_threads(n: int) -> None:
        state["nthreads"] = n

    return Coder(label, enc, dec, f"blosc2 {blosc2.__version__}", True, set_threads)


def zipnn_coder() -> Coder | None:
    try:
        from zipnn import ZipNN
    except ImportError:
        return None
    dtypes = {2: "bfloat16", 4: "float32"}
    cache: dict[tuple[int, int], object] = {}
    state = {"threads": 1}

    def get(size: int) -> object:
        key = (size, state["threads"], threading.get_ident())  # one object per thread
        if key not in cache:
            # reorder_signbit=255: zipnn 0.5.4's default sign-bit reordering does not round
            # trip on 'byte' input (measured), so it is switched off
            cache[key] = ZipNN(input_format="byte", bytearray_dtype=dtypes.get(size, "float32"),
                               threads=state["threads"], reorder_signbit=255)
        return cache[key]

    def enc(buf: np.ndarray, size: int) -> bytes:
        if size not in dtypes:
            return _zstd(3).compress(buf)
        return bytes(get(size).compress(buf.tobytes()))

    def dec(blob: bytes, size: int, n: int) -> np.ndarray:
        if size not in dtypes:
            return np.frombuffer(_zd().decompress(blob, max_output_size=n), np.uint8)
        return np.frombuffer(bytes(get(size).decompress(blob)), np.uint8)

    def set_threads(n: int) -> None:
        state["threads"] = n

    return Coder("zipnn", enc, dec, "zipnn default method (AUTO), imports torch", True, set_threads)


def all_coders() -> dict[str, Coder]:
    coders = [zstd_coder(3), grouped_zstd_coder(1), grouped_zstd_coder(3)]
    coders.append(planes_coder({}, 3, "planes zstd-3"))
    coders.append(planes_coder({0: 3, 1: 3}, 1, "planes hi zstd-3 lo zstd-1"))
    coders.append(planes_coder({0: 3, 1: 1}, 0, "planes hi zstd-3/1 lo raw"))
    if blosc2 is not None:
        F, C = blosc2.Filter, blosc2.Codec
        for level in (1, 3, 5):
            coders.append(blosc2_coder(f"blosc2 shuffle+zstd-{level}", [F.SHUFFLE], C.ZSTD, level))
        coders.append(blosc2_coder("blosc2 bitshuffle+zstd-3", [F.BITSHUFFLE], C.ZSTD, 3))
        coders.append(blosc2_coder("blosc2 shuffle+lz4-5", [F.SHUFFLE], C.LZ4, 5))
        if hasattr(F, "BYTEDELTA"):
            coders.append(blosc2_coder("blosc2 shuffle+bytedelta+zstd-3", [F.SHUFFLE, F.BYTEDELTA], C.ZSTD, 3))
    z = zipnn_coder()
    if z is not None:
        coders.append(z)
    return {c.name: c for c in coders}


def stored_size(blob: bytes, nbytes: int) -> int:
    """What a piece costs: its blob, or the piece itself if the blob is not smaller."""
    return min(len(blob), nbytes)
