"""safetensors files: an 8-byte little-endian header length N, N bytes of JSON, then the data.

Each JSON entry except "__metadata__" is {"dtype", "shape", "data_offsets": [begin, end]}
with offsets relative to the data start 8 + N. Region name = the JSON key (the state-dict
key), so names are stable across checkpoints of one run. Reads: bytes 0..8+N only."""
from __future__ import annotations

import json
import struct

from ._base import ELEM_SIZE, Malformed, Reader, TensorRegion, int_tuple, prod

MAX_HEADER = 100 << 20  # the limit the safetensors library itself enforces


def looks_like(head: bytes, size: int) -> bool:
    """Cheap sniff: a plausible header length and a JSON object right after it."""
    if len(head) < 9 or size < 10:
        return False
    (n,) = struct.unpack_from("<Q", head, 0)
    return 2 <= n <= MAX_HEADER and 8 + n <= size and head[8:9] == b"{"


def parse(reader: Reader, base: int = 0) -> list[TensorRegion]:
    """Regions of a safetensors file (zero-length tensors are left out), or of a
    safetensors blob that starts at `base` and ends at the file end."""
    size = reader.size
    (n,) = struct.unpack("<Q", reader(base, 8))
    if not 2 <= n <= MAX_HEADER or base + 8 + n > size:
        raise Malformed("safetensors: bad header length")
    try:
        header = json.loads(reader(base + 8, n).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise Malformed(f"safetensors: header is not JSON: {e}") from None
    if not isinstance(header, dict):
        raise Malformed("safetensors: header is not an object")
    start = base + 8 + n
    out: list[TensorRegion] = []
    spans: list[tuple[int, int]] = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(entry, dict):
            raise Malformed(f"safetensors: entry {name!r} is not an object")
        dtype = entry.get("dtype")
        shape = int_tuple(entry.get("shape"))
        offsets = int_tuple(entry.get("data_offsets"))
        if not isinstance(dtype, str) or dtype not in ELEM_SIZE:
            raise Malformed(f"safetensors: {name!r}: unknown dtype {dtype!r}")
        if shape is None or offsets is None or len(offsets) != 2:
            raise Malformed(f"safetensors: {name!r}: bad shape or data_offsets")
        begin, end = offsets
        elem = ELEM_SIZE[dtype]
        if begin > end or start + end > size or end - begin != prod(shape) * elem:
            raise Malformed(f"safetensors: {name!r}: offsets do not match shape or file")
        spans.append((begin, end))
        if end > begin:
            out.append(TensorRegion(name, dtype, elem, shape, start + begin, end - begin))
    spans.sort()
    for (_, prev_end), (begin, _) in zip(spans, spans[1:]):
        if begin < prev_end:
            raise Malformed("safetensors: tensors overlap")
    return out
