"""`open_read(path)`: a file's committed bytes as a read-only file object, handed over by the
cowfs mount's daemon in a memfd, without FUSE READs (fs/get_op.py).

The file is opened for reading through the mount first, so the kernel checks permissions as
for any open; the descriptor, named by its number, is the proof the daemon asks for (it reads
the descriptor's flags, mount and inode in this process's /proc fdinfo). The daemon reads the version
that open gets and checks every chunk as every read is. By default it answers with a memfd
of its bytes sealed against any change: the file object reads it, and
`torch.load(..., mmap=True)` maps it (through /proc/self/fd). With `kept=True` it fills one
of the process's kept memfds instead (part_memfds.py: sealed against shrinking only, its
pages made by an earlier get or put, so the daemon does not make them again), which the
file object gives back when it is closed: for readers that copy the bytes out and close
(DCP's), never for a mapping that outlives the file object. Where the path is not on a
cowfs mount, its daemon takes no gets, or the file is too large for memory (the daemon says
ENOMEM), the file object is the file itself, read through the mount.

`ranges` ([(offset, length), ...], sorted, apart): only those bytes are got (the daemon
widens them to whole chunks); the file object still reads in the file's offsets, and what it
is asked for outside them it reads through the mount. A daemon from before ranges sends the
whole file, which is then read as without them.
"""
from __future__ import annotations

import bisect
import errno
import fcntl
import io
import os
import socket
from typing import Any, BinaryIO, cast

from .bulk import BulkRefused, daemon_socket, request
from .part_memfds import PartMemfds, part_memfds

WIDENED = 2 << 20  # bytes a range may grow by when the daemon widens it to whole chunks (a piece each side)
MAX_SENT = 128  # ranges one get names at most (its request is one line of at most 4096 bytes)


def fitted(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, apart (offset, length) ranges made at most MAX_SENT by joining the ones with the
    smallest gaps between them (the bytes between are got too)."""
    out = list(ranges)
    while len(out) > MAX_SENT:
        i = min(range(len(out) - 1), key=lambda k: out[k + 1][0] - (out[k][0] + out[k][1]))
        (o1, _n1), (o2, n2) = out[i], out[i + 1]
        out[i:i + 2] = [(o1, o2 + n2 - o1)]
    return out


def is_memfd(fd: int) -> bool:
    """Whether `fd` is a memfd (what a get hands over)."""
    return os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:")


def open_read(path: str | os.PathLike, kept: bool = False,
              ranges: list[tuple[int, int]] | None = None) -> BinaryIO:
    """`path`'s bytes, read-only (see the module docstring). Raises OSError (BulkRefused, EIO
    for a damaged chunk) as a read would."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        sock = daemon_socket(fd)
        if sock is not None:
            try:
                with sock:
                    got = _get(sock, fd, os.fspath(path), kept, ranges)
            except BulkRefused as e:  # a daemon from before gets took a memfd: the get it knows
                if not (kept and e.errno == errno.EINVAL and "sends no descriptor" in str(e)):
                    raise
                got, again = None, daemon_socket(fd)
                if again is not None:
                    with again:
                        got = _get(again, fd, os.fspath(path), False, ranges)
            if isinstance(got, _RangedBytes):
                return cast(BinaryIO, got)  # (it keeps the descriptor, for reads outside its ranges)
            if got is not None:
                os.close(fd)
                return got
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _get(sock: socket.socket, fd: int, what: str, kept: bool,
         ranges: list[tuple[int, int]] | None) -> "BinaryIO | _RangedBytes | None":
    """The file object of a get on `sock`; None when the daemon has no memory for it (ENOMEM)."""
    memfds = part_memfds()
    size = os.fstat(fd).st_size
    want = size if ranges is None else min(size, sum(n for _o, n in ranges) + len(ranges) * WIDENED)
    taken = memfds.take_for(want) if kept else None  # None: the daemon makes a memfd
    memfd = -1 if taken is None else taken
    header: dict[str, Any] = {"op": "get", "fd": fd, "into": memfd >= 0}
    if ranges is not None:
        header["ranges"] = [[o, n] for o, n in fitted(ranges)]
    try:
        if memfd >= 0:  # (a memfd kept for puts carries no seal: the daemon needs this one)
            fcntl.fcntl(memfd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
        result, fds = request(sock, header, [memfd] if memfd >= 0 else [], what)
    except BaseException as e:
        if memfd >= 0:  # an answer (the daemon is done with it) or a connection gone mid-get (it may not be)
            (memfds.give if isinstance(e, BulkRefused) else memfds.drop)(memfd)
        if isinstance(e, BulkRefused) and e.errno == errno.ENOMEM:
            return None
        raise
    got_ranges = result.get("ranges") if ranges is not None else None  # (none from a daemon before ranges)
    if memfd >= 0:
        for extra in fds:
            os.close(extra)
        if got_ranges is not None:
            return _RangedBytes(_KeptBytes(memfds, memfd, int(result["filled"])), got_ranges, fd, int(result["size"]))
        return cast(BinaryIO, _KeptBytes(memfds, memfd, int(result["size"])))
    if len(fds) != 1:
        for extra in fds:
            os.close(extra)
        raise BulkRefused(errno.EIO, f"{what}: the cowfs daemon answered a get without its memfd")
    if got_ranges is not None:
        return _RangedBytes(os.fdopen(fds[0], "rb"), got_ranges, fd, int(result["size"]))
    return os.fdopen(fds[0], "rb")


class _Positioned(io.RawIOBase):
    """A read-only, seekable file object of `size` bytes: where it is (its readers say what)."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self._size, self._pos = size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        if base + offset < 0:
            raise OSError(errno.EINVAL, "negative seek position")
        self._pos = base + offset
        return self._pos


class _KeptBytes(_Positioned):
    """The first `size` bytes of a kept memfd, read-only and seekable; `close` gives the memfd
    back (whatever the file object's reader made of the bytes must be copies by then)."""

    def __init__(self, memfds: PartMemfds, memfd: int, size: int) -> None:
        super().__init__(size)
        self._memfds, self._memfd = memfds, memfd

    def fileno(self) -> int:
        return self._memfd

    def read(self, n: int = -1) -> bytes:  # type: ignore[override]
        """(one copy: the memfd's pages into a new bytes object)"""
        if self.closed:
            raise ValueError("read of a closed file")
        end = self._size if n is None or n < 0 else min(self._size, self._pos + n)
        if end <= self._pos:
            return b""
        data = os.pread(self._memfd, end - self._pos, self._pos)
        self._pos += len(data)
        return data

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        want = max(0, min(len(view), self._size - self._pos))
        n = os.preadv(self._memfd, [view[:want]], self._pos) if want else 0
        self._pos += n
        return n

    def close(self) -> None:
        if not self.closed:
            self._memfds.give(self._memfd)
            self._memfd = -1
        super().close()


class _RangedBytes(_Positioned):
    """A file read in its own offsets from the bytes of some of its ranges, which lie back to
    back in `got` (a memfd's file object); what lies outside them is read from `fd`, the
    file open through the mount (the descriptor is closed with the object)."""

    def __init__(self, got: Any, ranges: list[list[int]], fd: int, size: int) -> None:
        super().__init__(size)
        self._got, self._fd = got, fd
        self._ranges: list[tuple[int, int, int]] = []  # (file offset, length, offset in got)
        at = 0
        for off, n in ranges:
            self._ranges.append((int(off), int(n), at))
            at += int(n)

    def _where(self, pos: int) -> tuple[int, int] | None:
        """(offset in got, bytes there) of the range holding `pos`; None outside them."""
        i = bisect.bisect_right(self._ranges, (pos, float("inf"))) - 1
        if i >= 0:
            off, n, at = self._ranges[i]
            if pos < off + n:
                return at + pos - off, off + n - pos
        return None

    def readinto(self, buffer: Any) -> int:
        if self.closed:
            raise ValueError("read of a closed file")
        view = memoryview(buffer).cast("B")
        want = max(0, min(len(view), self._size - self._pos))
        done = 0
        while done < want:
            where = self._where(self._pos)
            if where is None:  # (through the mount)
                n = os.preadv(self._fd, [view[done:want]], self._pos)
            else:
                at, n = where
                self._got.seek(at)
                n = self._got.readinto(view[done:done + min(n, want - done)])
            if not n:
                break
            done += n
            self._pos += n
        return done

    def read(self, n: int = -1) -> bytes:  # type: ignore[override]
        if self.closed:
            raise ValueError("read of a closed file")
        end = self._size if n is None or n < 0 else min(self._size, self._pos + n)
        where = self._where(self._pos)
        if where is not None and where[1] >= end - self._pos:  # within one range: one copy
            self._got.seek(where[0])
            data = self._got.read(end - self._pos)
            self._pos += len(data)
            return bytes(data)
        buf = bytearray(max(end - self._pos, 0))
        got = self.readinto(buf)
        return bytes(buf[:got])

    def readall(self) -> bytes:
        return self.read(-1)

    def close(self) -> None:
        if not self.closed:
            self._got.close()
            os.close(self._fd)
        super().close()
