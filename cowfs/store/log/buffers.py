"""Buffers kept for reuse: O_DIRECT staging (device.py) and read windows (reader.py).

A new buffer's pages fault in when they are first touched, which costs milliseconds per
window with the GIL held (docs/benchmarks.md, third round). A buffer taken from a pool was
touched before and costs nothing.
"""
from __future__ import annotations

import contextlib
import mmap
import threading
from typing import Callable, Generic, Iterator, TypeVar

from ... import _native

B = TypeVar("B", mmap.mmap, bytearray)


class BufferPool(Generic[B]):
    """Buffers of `size` bytes; at most `keep` free ones are kept. A buffer given back is kept
    only if `reusable(buf)` says so; one that is not kept is passed to `discard`."""

    def __init__(self, size: int, keep: int, make: Callable[[int], B],
                 reusable: Callable[[B], bool] = lambda _b: True,
                 discard: Callable[[B], None] = lambda _b: None) -> None:
        self.size = size
        self.keep = keep
        self._make = make
        self._reusable = reusable
        self._discard = discard
        self._free: list[B] = []
        self._lock = threading.Lock()

    def take(self) -> B:
        """A buffer of `size` bytes with arbitrary contents."""
        with self._lock:
            if self._free:
                return self._free.pop()
        return self._make(self.size)

    def give(self, buf: B) -> None:
        if len(buf) == self.size and self._reusable(buf):
            with self._lock:
                if len(self._free) < self.keep:
                    self._free.append(buf)
                    return
        self._discard(buf)

    @contextlib.contextmanager
    def lend(self) -> Iterator[memoryview]:
        """A view of a buffer from the pool for the duration of the block."""
        buf = self.take()
        try:
            with memoryview(buf) as view:
                yield view
        finally:
            self.give(buf)


def staging_pool(size: int, keep: int) -> BufferPool[mmap.mmap]:
    """Page-aligned buffers (anonymous mmaps), as O_DIRECT needs."""
    return BufferPool(size, keep, lambda n: mmap.mmap(-1, n), discard=lambda m: m.close())


def window_pool(size: int, keep: int) -> BufferPool[bytearray]:
    """bytearrays that come back only when no view of them is left: a reply the FUSE layer is
    still sending holds a slice of its window. A new one is not zeroed (`bytearray(n)` would
    zero it with the GIL held): its pages fault in as the read fills it, outside the GIL."""
    return BufferPool(size, keep, _native.uninit_bytearray, reusable=lambda b: not _native.bytearray_exported(b))


def uninitialised(n: int) -> memoryview:
    """A writable buffer of n bytes not zeroed (`_native.uninit_bytearray`, as window_pool's),
    for bytes about to be overwritten whole (a record's payload read, a delta decoded):
    bytearray(n) would zero them first, one more pass over the memory (6% of the CPU of
    reading a checkpoint three deltas old)."""
    return memoryview(_native.uninit_bytearray(n))
