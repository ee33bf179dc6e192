"""Content-defined chunking (FastCDC, ~64 KiB average) and BLAKE3-256 chunk ids.

A cut depends only on the bytes since the previous cut, so the same bytes give
the same chunks wherever they sit in a file: a shift of data.pkl in torch.save
output resynchronises after one chunk, and a re-chunk that starts at an old
chunk boundary reproduces the old chunks.
"""
from __future__ import annotations

import blake3
from pyfastcdc.cy import FastCDC

AVG_CHUNK = 64 << 10
MIN_CHUNK = 16 << 10
MAX_CHUNK = 256 << 10

_cdc = FastCDC(avg_size=AVG_CHUNK, min_size=MIN_CHUNK, max_size=MAX_CHUNK)


def chunk_id(data: bytes | memoryview) -> bytes:
    return blake3.blake3(data).digest()


class StreamChunker:
    """Cut a byte stream that arrives in pieces into content-defined chunks.

    The bytes after the last certain cut are carried over to the next `feed`
    (at most MAX_CHUNK bytes), so memory stays bounded by one batch.
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

    def feed(self, data: bytes | memoryview | list[bytes], final: bool = False) -> list[memoryview]:
        """Cut the carried bytes and `data` (one buffer, or pieces to be taken in order): the
        certain chunks, as views of one buffer made with a single copy (none when `data` is one
        bytes object and nothing is carried)."""
        pieces = list(data) if isinstance(data, list) else [data]
        if self._carry:
            pieces.insert(0, self._carry)
        pieces = [p for p in pieces if len(p)]
        if not pieces:
            return []
        buf = pieces[0] if len(pieces) == 1 and isinstance(pieces[0], bytes) else b"".join(pieces)
        cuts = [c.length for c in _cdc.cut_buf(buf)]
        if not final:
            cuts.pop()
        out: list[memoryview] = []
        pos = 0
        mv = memoryview(buf)
        for n in cuts:
            out.append(mv[pos:pos + n])
            pos += n
        self._carry = bytes(mv[pos:])  # at most MAX_CHUNK bytes
        self.offset += pos
        return out

    def state(self) -> tuple[int, bytes]:
        return self.offset, self._carry

    def restore(self, state: tuple[int, bytes]) -> None:
        """Go back to a `state()` taken earlier (a batch whose chunks could not be stored)."""
        self.offset, self._carry = state

    def reset(self, offset: int) -> None:
        """Drop the carry and restart the stream at `offset` (a known chunk boundary)."""
        self._carry = b""
        self.offset = offset


def cut_all(data: bytes | memoryview) -> list[memoryview]:
    s = StreamChunker()
    return s.feed(data, final=True)
