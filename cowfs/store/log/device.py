"""Segment files on a device: `file` (pwrite + fdatasync) and `direct` (O_DIRECT writes of
whole blocks + fdatasync); `pmem` (mmap + cache-line persist) is in pmem.py.

A segment is one preallocated file. The log appends to it in large batches and
calls `persist()` at each durability point. Everything before the last
`persist()` survives a crash or power loss; nothing after it is promised.
"""
from __future__ import annotations

import ctypes
import errno
import mmap
import os
import threading
from pathlib import Path
from typing import Protocol

from ... import _native
from ...errors import CowfsError, NoSpace
from .buffers import staging_pool

IOV_MAX = 1024  # buffers per pwritev (Linux UIO_MAXIOV)


def _raise_os(e: OSError, what: str) -> None:
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        raise NoSpace(f"{what}: no space left on device") from None
    raise CowfsError(f"{what}: {os.strerror(e.errno or errno.EIO)}", errno=e.errno or errno.EIO) from None


class Segment(Protocol):
    path: Path
    size: int
    aligned_writes: bool

    def write(self, offset: int, data: bytes | bytearray | memoryview) -> None: ...
    def write_parts(self, offset: int, parts: list[bytes | memoryview]) -> None: ...
    def write_aligned(self, offset: int, data: memoryview) -> bool: ...
    def read(self, offset: int, length: int) -> bytes: ...
    def read_into(self, offset: int, buffers: list[memoryview]) -> int: ...
    def will_need(self, offset: int, length: int) -> None: ...
    def persist(self) -> None: ...
    def punch(self, offset: int, length: int) -> None: ...
    def truncate(self, length: int) -> None: ...
    def image(self) -> mmap.mmap | bytes: ...
    def allocated_bytes(self) -> int: ...
    def close(self) -> None: ...


def is_block_aligned(view: memoryview) -> bool:
    """Whether the buffer's first byte lies on a BLOCK boundary in memory (a page-aligned
    mmap's view and its block-aligned slices do), as O_DIRECT needs."""
    if view.readonly or not view.contiguous or not len(view):
        return False
    return ctypes.addressof(ctypes.c_char.from_buffer(view)) % BLOCK == 0


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

    @property
    def aligned_writes(self) -> bool:
        """Whether write_aligned writes (DirectFileSegment with its O_DIRECT descriptor)."""
        return False

    def write_aligned(self, offset: int, data: memoryview) -> bool:
        """Write block-aligned `data` straight from the caller's buffer where this segment can
        (DirectFileSegment); False here: nothing written, the caller uses write_parts."""
        return False

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


BLOCK = 4096  # O_DIRECT alignment of offsets, lengths and buffers (covers 512 B and 4 KiB sectors)


def round_up(n: int, align: int = BLOCK) -> int:
    return (n + align - 1) // align * align

STAGING = 8 << 20  # largest aligned staging buffer a direct segment keeps for its writes


# writes to one segment are serialized; up to one per head segment at once (heads.MOST_HEADS)
WRITE_STAGING = staging_pool(STAGING, keep=8)


class DirectFileSegment(FileSegment):
    """Writes bypass the page cache: O_DIRECT writes of whole 4 KiB blocks from an aligned buffer.

    The log appends records of any length back to back, so a write rarely ends on a block
    boundary. Its last partial block is held in memory and written (filled up with the bytes
    the file has after it) only when something needs it on the device: `persist()`, a read or
    punch that touches it, a write elsewhere, `truncate`, `image` or `close`. The next append
    continues from the held copy, so the block is written again whole, its earlier bytes
    unchanged.

    Reads, punches and `image` use the ordinary (page-cache) descriptor, as `FileSegment`
    does, read-ahead hints included; the kernel keeps the two descriptors coherent. (Window
    loads with O_DIRECT were tried and measured slower: docs/benchmarks.md, fourth round.)

    Where the filesystem refuses O_DIRECT (at open or on the first write) the segment falls
    back to plain pwrite + fdatasync, like `FileSegment`.
    """

    def __init__(self, path: Path, fd: int, dfd: int) -> None:
        super().__init__(path, fd)
        self.dfd = dfd  # -1: no direct descriptor, buffered writes
        self._lock = threading.Lock()
        self._held_off = -1  # block-aligned offset of the block held in memory; -1: none
        self._held = b""  # that block's bytes up to the end of the last write into it
        self._held_dirty = False  # written since the block last went to the device

    @staticmethod
    def _open_direct(path: Path) -> int:
        try:
            return os.open(path, os.O_RDWR | os.O_DIRECT | os.O_CLOEXEC)
        except OSError as e:
            if e.errno == errno.EINVAL:  # the filesystem has no O_DIRECT
                return -1
            _raise_os(e, f"open {path}")
            raise

    @classmethod
    def create(cls, path: Path, size: int) -> "DirectFileSegment":
        seg = FileSegment.create(path, size)
        return cls(path, seg.fd, cls._open_direct(path))

    @classmethod
    def open(cls, path: Path, writable: bool = True) -> "DirectFileSegment":
        seg = FileSegment.open(path, writable)
        if not writable:
            return cls(path, seg.fd, -1)  # reads use the page cache anyway
        try:
            dfd = cls._open_direct(path)
        except CowfsError:
            seg.close()
            raise
        return cls(path, seg.fd, dfd)

    # -- writes -----------------------------------------------------------

    def write(self, offset: int, data: bytes | bytearray | memoryview) -> None:
        self.write_parts(offset, [data])

    def write_parts(self, offset: int, parts: list[bytes | memoryview]) -> None:
        views = [memoryview(p).cast("B") for p in parts if len(p)]
        if not views:
            return
        with self._lock:
            if self.dfd >= 0:
                try:
                    self._write_direct(offset, views)
                    return
                except OSError as e:
                    if e.errno != errno.EINVAL:
                        _raise_os(e, f"write {self.path}")
                    self._stop_direct()  # refused after all: write it all again through the page cache
            FileSegment.write_parts(self, offset, views)

    def _write_direct(self, offset: int, views: list[memoryview]) -> None:
        start = offset - offset % BLOCK
        if self._held_off == start and len(self._held) == offset - start:
            prefix: bytes | memoryview = self._held  # continuing an append: the block as last written
        else:
            self._seal()
            prefix = self._existing(start, offset - start)
        total = len(prefix) + sum(len(v) for v in views)
        cap = min(WRITE_STAGING.size, round_up(total))
        with WRITE_STAGING.lend() as stage:
            self._fill_and_write(stage, cap, start, prefix, views)

    @property
    def aligned_writes(self) -> bool:
        return self.dfd >= 0

    def write_aligned(self, offset: int, data: memoryview) -> bool:
        """Write `data` with O_DIRECT straight from the caller's buffer, no copy into staging:
        its address, its length and `offset` must be multiples of BLOCK, and it replaces
        whole blocks that hold nothing yet (the log's aligned appends). False, with nothing
        written, where that cannot be done (no direct descriptor, a buffer not aligned, or
        the filesystem refusing O_DIRECT after all): the caller writes it another way."""
        if offset % BLOCK or len(data) % BLOCK or not is_block_aligned(data):
            return False
        with self._lock:
            if self.dfd < 0:
                return False
            self._seal()  # a held block lies before `offset`: it goes to the device first, as before any other write
            try:
                self._pwrite_direct(data, offset)
            except OSError as e:
                if e.errno != errno.EINVAL:
                    _raise_os(e, f"write {self.path}")
                self._stop_direct()
                return False
        return True

    def _fill_and_write(self, stage: memoryview, cap: int, start: int, prefix: bytes | memoryview,
                        views: list[memoryview]) -> None:
        stage[:len(prefix)] = prefix
        pos, at = len(prefix), start
        for v in views:
            while len(v):
                k = min(len(v), cap - pos)
                stage[pos:pos + k] = v[:k]
                pos += k
                v = v[k:]
                if pos == cap:
                    self._pwrite_direct(stage[:cap], at)
                    at += cap
                    pos = 0
        whole = pos - pos % BLOCK
        if whole:
            self._pwrite_direct(stage[:whole], at)
            at += whole
        self._held_off, self._held, self._held_dirty = at, bytes(stage[whole:pos]), pos > whole

    def _seal(self) -> None:
        """Put the held block on the device (under `_lock`)."""
        if not self._held_dirty:
            return
        off, held = self._held_off, self._held
        if off + BLOCK > self.size or self.dfd < 0:  # the file's last, partial block: never extend it
            FileSegment.write(self, off, held)
        else:
            with WRITE_STAGING.lend() as stage:
                stage[:len(held)] = held
                stage[len(held):BLOCK] = self._existing(off + len(held), BLOCK - len(held))
                try:
                    self._pwrite_direct(stage[:BLOCK], off)
                except OSError as e:
                    _raise_os(e, f"write {self.path}")
        self._held_dirty = False

    def _existing(self, offset: int, length: int) -> bytes:
        """The file's bytes at [offset, offset+length), zeros past its end."""
        if length <= 0:
            return b""
        data = self.read_plain(offset, length)
        return data + bytes(length - len(data))

    def _pwrite_direct(self, data: memoryview, offset: int) -> None:
        while len(data):
            n = os.pwrite(self.dfd, data, offset)
            data = data[n:]
            offset += n

    def _stop_direct(self) -> None:
        os.close(self.dfd)
        self.dfd = -1
        if self._held_dirty:
            FileSegment.write(self, self._held_off, self._held)
            self._held_dirty = False

    def _seal_if_touched(self, offset: int, length: int) -> None:
        if self._held_dirty and self._held_off < offset + length and offset < self._held_off + BLOCK:
            with self._lock:
                self._seal()

    # -- everything else sees the device as it will be --------------------------------

    def read_plain(self, offset: int, length: int) -> bytes:
        return FileSegment.read(self, offset, length)

    def read(self, offset: int, length: int) -> bytes:
        self._seal_if_touched(offset, length)
        return FileSegment.read(self, offset, length)

    def read_into(self, offset: int, buffers: list[memoryview]) -> int:
        self._seal_if_touched(offset, sum(len(b) for b in buffers))
        return FileSegment.read_into(self, offset, buffers)

    def persist(self) -> None:
        with self._lock:
            self._seal()
        FileSegment.persist(self)

    def punch(self, offset: int, length: int) -> None:
        with self._lock:
            self._seal()
            if self._held_off < offset + length and offset < self._held_off + BLOCK:
                self._held_off, self._held = -1, b""  # the held copy no longer matches the file
            FileSegment.punch(self, offset, length)

    def truncate(self, length: int) -> None:
        with self._lock:
            self._seal()
            if self._held_off + BLOCK > length:
                self._held_off, self._held = -1, b""
            FileSegment.truncate(self, length)

    def image(self) -> mmap.mmap | bytes:
        with self._lock:
            self._seal()
        return FileSegment.image(self)

    def close(self) -> None:
        with self._lock:
            try:
                if self.fd >= 0:
                    self._seal()
            finally:
                if self.dfd >= 0:
                    os.close(self.dfd)
                    self.dfd = -1
                FileSegment.close(self)
