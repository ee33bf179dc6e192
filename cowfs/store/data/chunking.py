"""Content-defined chunking (FastCDC, ~64 KiB average) and BLAKE3-256 chunk ids.

A cut depends only on the bytes since the previous cut, so the same bytes give
the same chunks wherever they sit in a file: a shift of data.pkl in torch.save
output resynchronises after one chunk, and a re-chunk that starts at an old
chunk boundary reproduces the old chunks.

The cuts and ids of a whole batch come from one native call with the GIL released
(`_native.cdc_hash_batch`, native/dataplane.c): the same cuts as pyfastcdc's FastCDC with
these sizes (its gear tables and masks are taken from it here) and the same ids as the
blake3 package, over the batch's buffers as they are, without joining them.
"""
from __future__ import annotations

import bisect
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Callable, Protocol

import blake3
from pyfastcdc.py import FastCDC

from ... import _native

AVG_CHUNK = 64 << 10
MIN_CHUNK = 16 << 10
MAX_CHUNK = 256 << 10

Region = tuple[int, int, int]  # stream offsets [start, end), cut at start + k * step and end

_reference = FastCDC(avg_size=AVG_CHUNK, min_size=MIN_CHUNK, max_size=MAX_CHUNK).config
CDC_PARAMS = _native.cdc_config(_reference.gear.tobytes(), _reference.gear_ls.tobytes(), _reference.mask_s,
                                _reference.mask_l, MIN_CHUNK, AVG_CHUNK, MAX_CHUNK)


def chunk_id(data: bytes | memoryview) -> bytes:
    return blake3.blake3(data).digest()


Buffer = bytes | bytearray | memoryview


@dataclass(frozen=True)
class CutBatch:
    """Chunks cut from a stream's buffers: chunk i is the `lengths[i]` bytes after chunk
    i - 1, the first at stream offset `start`, in `pieces` taken one after another."""

    pieces: list[Buffer]
    lengths: bytes  # one u32 per chunk (native order)
    ids: bytes  # 32 bytes per chunk: BLAKE3-256
    start: int

    def __len__(self) -> int:
        return len(self.lengths) // 4

    def sizes(self) -> list[int]:
        return memoryview(self.lengths).cast("I").tolist()

    def hashes(self) -> list[bytes]:
        ids = self.ids
        return [ids[i:i + 32] for i in range(0, len(ids), 32)]


class StreamChunker:
    """Cut a byte stream that arrives in pieces into content-defined chunks (and, where the
    caller names tensor regions, into their pieces).

    The bytes after the last certain cut are carried over to the next `cut` (at most
    MAX_CHUNK bytes, or a tensor piece's step), so memory stays bounded by one batch.
    """

    def __init__(self) -> None:
        self._carry = b""
        self.offset = 0  # stream offset of the first carried byte

    @property
    def carry(self) -> bytes:
        return self._carry

    @property
    def carried(self) -> int:
        return len(self._carry)

    def cut(self, data: Buffer | list[Buffer], final: bool = False, threads: int = 1,
            fixed: Sequence[Region] = ()) -> CutBatch:
        """Cut the carried bytes and `data` (one buffer, or pieces to be taken in order) and
        hash the chunks, in one native call on `threads` threads: the certain chunks (every
        chunk when `final`). `fixed`: regions (stream offsets, sorted, not overlapping) cut
        as tensor pieces, at their start, every step and their end."""
        pieces = list(data) if isinstance(data, list) else [data]
        if self._carry:
            pieces.insert(0, self._carry)
        plan = self._plan(fixed)
        lengths, ids, consumed = _native.cdc_hash_batch(CDC_PARAMS, pieces, final, True, threads, plan)
        batch = CutBatch(pieces, lengths, ids, self.offset)
        self._carry = _tail(pieces, consumed)  # at most MAX_CHUNK bytes, or a tensor piece
        self.offset += consumed
        return batch

    def _plan(self, fixed: Sequence[Region]) -> bytes | None:
        """`fixed` as cdc_hash_batch's u64 triples, from this batch's first byte. A region
        that began before it goes on from its first step boundary in the batch."""
        if not fixed:
            return None
        out: list[int] = []
        at = self.offset
        for start, end, step in fixed:
            if end <= at:
                continue
            if start < at:
                start += -(-(at - start) // step) * step
                if start >= end:
                    continue
            out += (start - at, end - at, step)
        return struct.pack(f"={len(out)}Q", *out)

    def state(self) -> tuple[int, bytes]:
        return self.offset, self._carry

    def restore(self, state: tuple[int, bytes]) -> None:
        """Go back to a `state()` taken earlier (a batch whose chunks could not be stored)."""
        self.offset, self._carry = state

    def reset(self, offset: int) -> None:
        """Drop the carry and restart the stream at `offset` (a known chunk boundary)."""
        self._carry = b""
        self.offset = offset


class StreamLayout(Protocol):
    """What a write stream's bytes say of its tensor regions (tensors/write_layout.py),
    learnt batch by batch before each cut."""

    def learn(self, start: int, end: int, read: Callable[[int, int], bytes], final: bool = False) -> None: ...

    def regions(self, start: int, end: int) -> list[Region]: ...


def stream_reader(pieces: list[Buffer], start: int) -> Callable[[int, int], bytes]:
    """read(offset, n): up to n bytes at stream offset `offset` of `pieces` taken in order
    from stream offset `start` (nothing outside them)."""
    bounds = list(accumulate((len(p) for p in pieces), initial=start))

    def read(offset: int, n: int) -> bytes:
        out: list[Buffer] = []
        i = max(bisect.bisect_right(bounds, offset) - 1, 0)
        while n > 0 and i < len(pieces):
            lo = offset - bounds[i]
            if 0 <= lo < len(pieces[i]):
                part = memoryview(pieces[i])[lo:lo + n]
                out.append(part)
                n -= len(part)
                offset += len(part)
            i += 1
        return b"".join(out)

    return read


def _tail(pieces: list[Buffer], skip: int) -> bytes:
    """The bytes of `pieces`, taken in order, after the first `skip`."""
    out: list[Buffer] = []
    for p in pieces:
        n = len(p)
        if skip >= n:
            skip -= n
            continue
        out.append(memoryview(p)[skip:] if skip else p)
        skip = 0
    return b"".join(out)


def cut_all(data: bytes | memoryview) -> list[memoryview]:
    """The chunks of one buffer, as views of it: the cuts alone (no ids), in one native call."""
    lengths, _ids, _consumed = _native.cdc_hash_batch(CDC_PARAMS, [data], True, False)
    mv = memoryview(data)
    out: list[memoryview] = []
    pos = 0
    for n in memoryview(lengths).cast("I"):
        out.append(mv[pos:pos + n])
        pos += n
    return out
