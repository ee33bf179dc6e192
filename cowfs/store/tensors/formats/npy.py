"""NumPy .npy files (format versions 1.0, 2.0, 3.0) and uncompressed .npz archives.

.npy: magic b"\\x93NUMPY", major, minor, then the header length (u16 LE for version 1,
u32 LE for 2 and 3), then the header: a Python dict literal (latin-1; utf-8 for 3.0) with
'descr', 'fortran_order', 'shape', parsed with ast.literal_eval. Data follows the header.
One region named "array". Only simple little-endian (or byte-order-free) descrs of known
dtypes are recognised: no structured, object, big-endian, datetime or string dtypes.
A Fortran-ordered array of shape S is reported with shape reversed(S), which is how its
bytes are laid out (C order).

.npz (np.savez, stored entries): one region per member "NAME.npy", named NAME."""
from __future__ import annotations

import ast
import struct
import sys

from . import _zip
from ._base import ELEM_SIZE, Malformed, Reader, TensorRegion, int_tuple, prod

MAGIC = b"\x93NUMPY"
MAX_HEADER = 1 << 16  # numpy itself refuses headers over 10000 bytes by default

# numpy descr without its byte-order character -> safetensors dtype name
_DESCR = {"f8": "F64", "f4": "F32", "f2": "F16", "i8": "I64", "i4": "I32", "i2": "I16",
          "i1": "I8", "u8": "U64", "u4": "U32", "u2": "U16", "u1": "U8", "b1": "BOOL",
          "c8": "C64", "c16": "C128"}


def looks_like(head: bytes) -> bool:
    return head[:6] == MAGIC


def parse(reader: Reader) -> list[TensorRegion]:
    region = _array(reader, 0, reader.size, "array")
    return [region] if region is not None else []


def _dtype(descr: object) -> str:
    if not isinstance(descr, str) or len(descr) < 3:
        raise Malformed(f"npy: unsupported descr {descr!r}")
    order, code = descr[0], descr[1:]
    dtype = _DESCR.get(code)
    if dtype is None:
        raise Malformed(f"npy: unsupported descr {descr!r}")
    if order == "<" or (order == "=" and sys.byteorder == "little"):
        return dtype
    if order == "|" and ELEM_SIZE[dtype] == 1:
        return dtype
    raise Malformed(f"npy: unsupported byte order in {descr!r}")


def _array(reader: Reader, start: int, end: int, name: str) -> TensorRegion | None:
    """The array stored at [start, end); None when it holds no bytes."""
    pre = reader(start, 12) if end - start >= 12 else reader(start, end - start)
    if pre[:6] != MAGIC or len(pre) < 10:
        raise Malformed("npy: bad magic")
    major = pre[6]
    if major == 1:
        (hlen,) = struct.unpack_from("<H", pre, 8)
        hstart = start + 10
    elif major in (2, 3) and len(pre) >= 12:
        (hlen,) = struct.unpack_from("<I", pre, 8)
        hstart = start + 12
    else:
        raise Malformed(f"npy: unknown version {major}")
    if hlen > MAX_HEADER or hstart + hlen > end:
        raise Malformed("npy: header runs past the end")
    text = reader(hstart, hlen).decode("utf-8" if major == 3 else "latin-1")
    try:
        header = ast.literal_eval(text.strip())
    except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError) as e:
        raise Malformed(f"npy: header is not a literal: {e}") from None
    if not isinstance(header, dict) or set(header) != {"descr", "fortran_order", "shape"}:
        raise Malformed("npy: header keys")
    dtype = _dtype(header["descr"])
    shape = int_tuple(header["shape"])
    fortran = header["fortran_order"]
    if shape is None or not isinstance(fortran, bool):
        raise Malformed("npy: bad shape or fortran_order")
    if fortran:
        shape = tuple(reversed(shape))
    data = hstart + hlen
    length = prod(shape) * ELEM_SIZE[dtype]
    if data + length > end:
        raise Malformed("npy: data runs past the end")
    if length == 0:
        return None
    return TensorRegion(name, dtype, ELEM_SIZE[dtype], shape, data, length)


def is_npz(archive: _zip.Archive) -> bool:
    return bool(archive.entries) and all(n.endswith(".npy") for n in archive.entries)


def parse_npz(reader: Reader, archive: _zip.Archive) -> list[TensorRegion]:
    out: list[TensorRegion] = []
    for entry in archive.entries.values():
        if entry.method != 0 or entry.comp_size != entry.size:
            raise Malformed(f"npz: {entry.name!r} is compressed")
        entry = _zip.locate(reader, archive, entry)
        region = _array(reader, entry.data, entry.data + entry.size, entry.name[:-4])
        if region is not None:
            if region.offset + region.length != entry.data + entry.size:
                raise Malformed(f"npz: {entry.name!r} size does not match its header")
            out.append(region)
    return out
