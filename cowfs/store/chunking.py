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

    def feed(self, data: bytes | memoryview, final: bool = False) -> list[bytes]:
        buf = self._carry + bytes(data) if self._carry else bytes(data)
        if not buf:
            return []
        cuts = [c.length for c in _cdc.cut_buf(buf)]
        if not final:
            cuts.pop()
        out: list[bytes] = []
        pos = 0
        mv = memoryview(buf)
        for n in cuts:
            out.append(bytes(mv[pos:pos + n]))
            pos += n
        self._carry = buf[pos:]
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


def cut_all(data: bytes | memoryview) -> list[bytes]:
    s = StreamChunker()
    return s.feed(data, final=True)
