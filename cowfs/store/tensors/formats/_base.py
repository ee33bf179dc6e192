"""What every format parser shares: the region type, dtype tables and a bounded reader.

Nothing here imports anything outside the standard library."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

ReadFn = Callable[[int, int], bytes]


@dataclass(frozen=True)
class TensorRegion:
    """One tensor's (or torch storage's) bytes inside a checkpoint file.

    name: stable identity across checkpoints of the same run (see each format's module).
    dtype: a safetensors dtype name ("F32", "BF16", "I64", ...); "U8" when unknown.
    shape: None when the format does not say (a torch storage viewed by several tensors).
    offset, length: absolute byte range in the file; length > 0."""

    name: str
    dtype: str
    elem_size: int
    shape: tuple[int, ...] | None
    offset: int
    length: int


class Malformed(Exception):
    """Raised inside parsers; `regions()` turns it (and any other exception) into None."""


# safetensors dtype name -> element size in bytes (the byte-sized ones; sub-byte F4/F6 are
# not recognised)
ELEM_SIZE: dict[str, int] = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2,
    "I64": 8, "I32": 4, "I16": 2, "I8": 1,
    "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1,
    "F8_E4M3": 1, "F8_E5M2": 1, "F8_E4M3FNUZ": 1, "F8_E5M2FNUZ": 1, "F8_E8M0": 1,
    "C32": 4, "C64": 8, "C128": 16,
}

# the legacy typed storage classes torch.save names in its persistent ids (GLOBAL torch X)
TORCH_STORAGE_DTYPE: dict[str, str] = {
    "DoubleStorage": "F64", "FloatStorage": "F32", "HalfStorage": "F16",
    "BFloat16Storage": "BF16", "LongStorage": "I64", "IntStorage": "I32",
    "ShortStorage": "I16", "CharStorage": "I8", "ByteStorage": "U8", "BoolStorage": "BOOL",
    "ComplexFloatStorage": "C64", "ComplexDoubleStorage": "C128",
    "QInt8Storage": "I8", "QUInt8Storage": "U8", "QInt32Storage": "I32",
    "QUInt4x2Storage": "U8", "QUInt2x4Storage": "U8",
}

# torch dtype attribute names (GLOBAL torch <name>, the dtype argument of _rebuild_tensor_v3)
TORCH_DTYPE: dict[str, str] = {
    "float64": "F64", "double": "F64", "float32": "F32", "float": "F32",
    "float16": "F16", "half": "F16", "bfloat16": "BF16",
    "int64": "I64", "long": "I64", "int32": "I32", "int": "I32",
    "int16": "I16", "short": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL",
    "uint16": "U16", "uint32": "U32", "uint64": "U64",
    "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2",
    "float8_e4m3fnuz": "F8_E4M3FNUZ", "float8_e5m2fnuz": "F8_E5M2FNUZ",
    "float8_e8m0fnu": "F8_E8M0",
    "complex32": "C32", "chalf": "C32", "complex64": "C64", "cfloat": "C64",
    "complex128": "C128", "cdouble": "C128",
}

MAX_READ_TOTAL = 256 << 20  # bytes one parse may read in all (headers, pickles, directories)


class Reader:
    """Random access to the file: serves from `head` when it can, checks every read is
    complete and within the file, and stops a parse that reads more than MAX_READ_TOTAL."""

    def __init__(self, head: bytes, size: int, read: ReadFn) -> None:
        if not isinstance(size, int) or size < 0:
            raise Malformed("bad size")
        self.head = bytes(head[:size])
        self.size = size
        self._read = read
        self.budget = MAX_READ_TOTAL
        self.reads = 0

    def __call__(self, offset: int, length: int) -> bytes:
        if offset < 0 or length < 0 or offset + length > self.size:
            raise Malformed(f"read [{offset}, +{length}) outside the file ({self.size})")
        if offset + length <= len(self.head):
            return self.head[offset:offset + length]
        self.budget -= length
        self.reads += 1
        if self.budget < 0:
            raise Malformed("read budget exhausted")
        data = self._read(offset, length)
        if not isinstance(data, (bytes, bytearray, memoryview)) or len(data) != length:
            raise Malformed("short read")
        return bytes(data)


def prod(dims: tuple[int, ...]) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


def int_tuple(value: object) -> tuple[int, ...] | None:
    """`value` as a tuple of non-negative ints (lists and tuples accepted), else None."""
    if not isinstance(value, (list, tuple)):
        return None
    if not all(type(v) is int and v >= 0 for v in value):
        return None
    return tuple(value)


def check(regions: list[TensorRegion], size: int) -> list[TensorRegion]:
    """Sort by offset and check the promises of `regions()`; raise Malformed otherwise."""
    out = sorted(regions, key=lambda r: r.offset)
    end = 0
    names: set[str] = set()
    for r in out:
        if r.length <= 0 or r.offset < end or r.offset + r.length > size:
            raise Malformed(f"region {r.name!r} overlaps or lies outside the file")
        if r.elem_size != ELEM_SIZE.get(r.dtype) or r.length % r.elem_size:
            raise Malformed(f"region {r.name!r}: bad dtype/length")
        if r.shape is not None and prod(r.shape) * r.elem_size != r.length:
            raise Malformed(f"region {r.name!r}: shape does not match length")
        if r.name in names:
            raise Malformed(f"duplicate region name {r.name!r}")
        names.add(r.name)
        end = r.offset + r.length
    return out
