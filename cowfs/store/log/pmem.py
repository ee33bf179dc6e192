"""The `pmem` device's segment: a shared mmap of the whole segment, written by copying into
it, made durable by flushing the CPU caches over the dirty range and msync (docs/design.md,
"Devices")."""
from __future__ import annotations

import mmap
import threading
from pathlib import Path

from ... import _native
from ...errors import CowfsError
from .device import FileSegment, _raise_os


class PmemSegment(FileSegment):
    """The segment mapped into memory; stores are made durable by cache-line write-back.

    On a DAX file (real persistent memory, MAP_SYNC works) `persist()` is clwb or
    clflushopt per line plus sfence. Where the mapping goes through the page
    cache (not DAX, as on this machine) it also calls msync for the dirty pages.
    """

    def __init__(self, path: Path, fd: int) -> None:
        super().__init__(path, fd)
        self.dax = self.size > 0 and _native.map_sync_supported(fd, self.size)
        self.map: mmap.mmap | None = mmap.mmap(fd, self.size) if self.size else None
        self._dirty_lock = threading.Lock()
        self._dirty_lo = self.size
        self._dirty_hi = 0

    def write(self, offset: int, data: bytes | bytearray | memoryview) -> None:
        PmemSegment.write_parts(self, offset, [data])  # not a subclass's write_parts: one write is one write

    def write_parts(self, offset: int, parts: list[bytes | bytearray | memoryview]) -> None:
        n = sum(len(p) for p in parts)
        if self.map is None or offset + n > self.size:
            raise CowfsError(f"write past the end of {self.path}")
        pos = offset
        for part in parts:
            self.map[pos:pos + len(part)] = part
            pos += len(part)
        with self._dirty_lock:
            self._dirty_lo = min(self._dirty_lo, offset)
            self._dirty_hi = max(self._dirty_hi, offset + n)

    def read(self, offset: int, length: int) -> bytes:
        if self.map is None:
            return b""
        return self.map[offset:offset + length]

    def read_into(self, offset: int, buffers: list[memoryview]) -> int:
        if self.map is None:
            return 0
        pos = offset
        with memoryview(self.map) as whole:
            for buf in buffers:
                n = max(0, min(len(buf), self.size - pos))
                buf[:n] = whole[pos:pos + n]
                pos += n
                if n < len(buf):
                    break
        return pos - offset

    def persist(self) -> None:
        with self._dirty_lock:
            lo, hi = self._dirty_lo, self._dirty_hi
            self._dirty_lo, self._dirty_hi = self.size, 0
        if self.map is None or hi <= lo:
            return
        _native.persist(self.map, lo, hi - lo)
        # Python's mmap cannot ask for MAP_SYNC, so even on DAX the file metadata
        # needs msync; on a page-cache mapping msync is what writes the data back.
        page = mmap.PAGESIZE
        plo = lo // page * page
        try:
            self.map.flush(plo, hi - plo)
        except OSError as e:
            _raise_os(e, f"msync {self.path}")

    def truncate(self, length: int) -> None:
        self.persist()
        if self.map is not None:
            self.map.close()
        super().truncate(length)
        self.map = mmap.mmap(self.fd, length) if length else None
        self._dirty_lo, self._dirty_hi = length, 0

    def image(self) -> mmap.mmap | bytes:
        return self.map if self.map is not None else b""

    def close(self) -> None:
        if self.map is not None:
            self.persist()
            self.map.close()
            self.map = None
        super().close()
