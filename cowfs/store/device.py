"""Segment files on a device: `file` (pwrite + fdatasync) and `pmem` (mmap + cache-line persist).

A segment is one preallocated file. The log appends to it in large batches and
calls `persist()` at each durability point. Everything before the last
`persist()` survives a crash or power loss; nothing after it is promised.
"""
from __future__ import annotations

import errno
import mmap
import os
import threading
from pathlib import Path
from typing import Protocol

from .. import _native
from ..errors import CowfsError, NoSpace

IOV_MAX = 1024  # buffers per pwritev (Linux UIO_MAXIOV)


def _raise_os(e: OSError, what: str) -> None:
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        raise NoSpace(f"{what}: no space left on device") from None
    raise CowfsError(f"{what}: {os.strerror(e.errno or errno.EIO)}", errno=e.errno or errno.EIO) from None


class Segment(Protocol):
    path: Path
    size: int

    def write(self, offset: int, data: bytes | bytearray | memoryview) -> None: ...
    def write_parts(self, offset: int, parts: list[bytes | memoryview]) -> None: ...
    def read(self, offset: int, length: int) -> bytes: ...
    def read_into(self, offset: int, buffers: list[memoryview]) -> int: ...
    def will_need(self, offset: int, length: int) -> None: ...
    def persist(self) -> None: ...
    def punch(self, offset: int, length: int) -> None: ...
    def truncate(self, length: int) -> None: ...
    def image(self) -> mmap.mmap | bytes: ...
    def allocated_bytes(self) -> int: ...
    def close(self) -> None: ...


def _consume(views: list[memoryview], n: int) -> None:
    """Drop the first `n` bytes of `views` (what one pwritev/preadv moved)."""
    while views and n >= len(views[0]):
        n -= len(views[0])
        views.pop(0)
    if n:
        views[0] = views[0][n:]


class FileSegment:
    """pwrite into the page cache, fdatasync to make it durable (NVMe, SSD, any disk)."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self.fd = fd
        self.size = os.fstat(fd).st_size

    @classmethod
    def create(cls, path: Path, size: int) -> "FileSegment":
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except OSError as e:
            _raise_os(e, f"create {path}")
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError as e:
            os.close(fd)
            os.unlink(path)
            _raise_os(e, f"preallocate {path}")
        return cls(path, fd)

    @classmethod
    def open(cls, path: Path, writable: bool = True) -> "FileSegment":
        try:
            fd = os.open(path, (os.O_RDWR if writable else os.O_RDONLY) | os.O_CLOEXEC)
        except OSError as e:
            _raise_os(e, f"open {path}")
        return cls(path, fd)

    def write(self, offset: int, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data)
        try:
            while view:
                n = os.pwrite(self.fd, view, offset)
                view = view[n:]
                offset += n
        except OSError as e:
            _raise_os(e, f"write {self.path}")

    def write_parts(self, offset: int, parts: list[bytes | memoryview]) -> None:
        """Write `parts` back to back from `offset`: pwritev, so the bytes are copied once (into
        the page cache), not first into one joined buffer."""
        views = [memoryview(p) for p in parts if len(p)]
        try:
            while views:
                n = os.pwritev(self.fd, views[:IOV_MAX], offset)
                offset += n
                _consume(views, n)
        except OSError as e:
            _raise_os(e, f"write {self.path}")

    def read(self, offset: int, length: int) -> bytes:
        try:
            return os.pread(self.fd, length, offset)
        except OSError as e:
            _raise_os(e, f"read {self.path}")
            raise

    def read_into(self, offset: int, buffers: list[memoryview]) -> int:
        """Fill `buffers` back to back from `offset` (preadv: straight from the page cache into
        them); returns the bytes read, short only at the end of the file."""
        views = [b for b in buffers if len(b)]
        total = 0
        try:
            while views:
                n = os.preadv(self.fd, views[:IOV_MAX], offset)
                if n == 0:
                    break
                offset += n
                total += n
                _consume(views, n)
        except OSError as e:
            _raise_os(e, f"read {self.path}")
        return total

    def will_need(self, offset: int, length: int) -> None:
        """Start reading these bytes into the page cache without waiting (a hint: errors ignored)."""
        try:
            os.posix_fadvise(self.fd, offset, length, os.POSIX_FADV_WILLNEED)
        except OSError:
            pass

    def persist(self) -> None:
        try:
            os.fdatasync(self.fd)
        except OSError as e:
            _raise_os(e, f"fdatasync {self.path}")

    def punch(self, offset: int, length: int) -> None:
        try:
            _native.punch_hole(self.fd, offset, length)
        except OSError as e:
            _raise_os(e, f"punch hole in {self.path}")

    def truncate(self, length: int) -> None:
        os.ftruncate(self.fd, length)
        os.fsync(self.fd)
        self.size = length

    def image(self) -> mmap.mmap | bytes:
        if self.size == 0:
            return b""
        return mmap.mmap(self.fd, self.size, prot=mmap.PROT_READ)

    def allocated_bytes(self) -> int:
        return os.fstat(self.fd).st_blocks * 512

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


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


def segment_class(device: str) -> type[FileSegment]:
    return PmemSegment if device == "pmem" else FileSegment
