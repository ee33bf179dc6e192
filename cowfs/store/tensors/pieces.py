"""How the compactor cuts a recognised checkpoint file: at tensor boundaries, and inside a
tensor into pieces of PIECE_BYTES (a multiple of the element size), so that piece k of
tensor T lines up with piece k of T in any other checkpoint. The bytes between tensors
(headers, pickles, zip records) and tensors too small to be worth a piece of their own
are cut by content (chunking.py), as the save path cuts everything.
"""
from __future__ import annotations

from dataclasses import dataclass

from .formats import TensorRegion
from .lineage import tensor_key

PIECE_BYTES = 1 << 20
MIN_TENSOR_BYTES = 4 << 10  # smaller tensors go with the bytes around them


@dataclass(frozen=True)
class Span:
    """A range of the file: a tensor piece (key set) or bytes to cut by content (key None)."""

    offset: int
    length: int
    key: bytes | None = None
    index: int = 0  # piece k of its tensor
    elem_size: int = 1
    dtype: str = ""  # a tensor piece's dtype (safetensors names): the float codec needs it

    @property
    def end(self) -> int:
        return self.offset + self.length


def plan(size: int, regions: list[TensorRegion]) -> list[Span]:
    """Spans tiling [0, size): tensor pieces of the regions worth cutting, content-cut spans
    for the rest."""
    out: list[Span] = []
    pos = 0
    for r, step in pieced(regions):
        if r.offset > pos:
            out.append(Span(pos, r.offset - pos))
        key = tensor_key(r.name, r.dtype, r.shape)
        for k, off in enumerate(range(r.offset, r.offset + r.length, step)):
            out.append(Span(off, min(step, r.offset + r.length - off), key, k, r.elem_size, r.dtype))
        pos = r.offset + r.length
    if pos < size:
        out.append(Span(pos, size - pos))
    return out


def pieced(regions: list[TensorRegion]) -> list[tuple[TensorRegion, int]]:
    """The regions (sorted by offset) worth cutting into pieces, each with its piece size:
    PIECE_BYTES rounded down to whole elements. Tensors under MIN_TENSOR_BYTES, and any
    overlapping one before it, go with the bytes around them. The compactor (`plan`) and the
    save (write_layout.py) cut by this one rule, so their pieces are the same."""
    out: list[tuple[TensorRegion, int]] = []
    pos = 0
    for r in regions:
        if r.length < MIN_TENSOR_BYTES or r.offset < pos:
            continue
        step = max(PIECE_BYTES - PIECE_BYTES % r.elem_size, r.elem_size) if r.elem_size > 0 else PIECE_BYTES
        out.append((r, step))
        pos = r.offset + r.length
    return out
