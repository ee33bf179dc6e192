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
cowfs mount or its daemon takes no gets, the file object is the file itself, read through
the mount.

`ranges` ([(offset, length), ...], sorted, apart): only those bytes are got (the daemon
widens them to whole chunks); the file object still reads in the file's offsets, and what it
is asked for outside them it gets on its own. A daemon from before ranges sends the whole
file, which is then read as without them.

Windows. A copying reader (`kept=True`) of a file larger than WINDOW, a reader of ranges, and
a reader of a file the daemon has no memory for get the wanted bytes one window (at most
WINDOW bytes, one memfd) at a time, as the reads reach them. Every get after the first asks
for the generation the first one read, so that all of them read one version even while a
writer commits another (the daemon keeps it while the file is open: design.md section 18).
"""
from __future__ import annotations

import bisect
import errno
import fcntl
import io
import os
import socket
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, BinaryIO, NamedTuple, cast

from .bulk import BulkRefused, daemon_socket, release_fd, request
from .part_memfds import PartMemfds, part_memfds

WIDENED = 2 << 20  # bytes a range may grow by when the daemon widens it to whole chunks (a piece each side)
MAX_SENT = 128  # ranges one get names at most (its request is one line of at most 4096 bytes)
WINDOW = 1 << 30  # bytes one get of a copying reader holds at most: more are got a window at a time


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
        size, what = os.fstat(fd).st_size, os.fspath(path)
        wanted = [(o, n) for o, n in ranges if n > 0] if ranges is not None else [(0, size)] if size else []
        if (ranges is None and not (kept and size > WINDOW)) or not wanted:
            got = _fetch(fd, what, kept, None, None)
            if got is _NO_DAEMON:
                return os.fdopen(fd, "rb")
            if got is not None:
                release_fd(fd)
                return cast(BinaryIO, got.file)
            # (ENOMEM: the whole file does not fit the daemon's bound; windows of it do)
        return _windowed(fd, what, wanted, size)
    except BaseException:
        release_fd(fd)  # (whatever raised took no ownership of it: _WindowedBytes gives it up)
        raise


class _Got(NamedTuple):
    """What one get answered: `file` reads the memfd's bytes, which are the file's `ranges`
    back to back (None: the whole file, `size` bytes), of the version visible at `gen` (None
    from a daemon before generations), whose id is `vid`."""

    file: Any
    size: int
    ranges: list[list[int]] | None
    gen: int | None
    vid: int | None


_NO_DAEMON = object()  # the file is not on a cowfs mount whose daemon takes gets


def _fetch(fd: int, what: str, kept: bool, ranges: list[tuple[int, int]] | None,
           gen: int | None) -> Any:
    """One get of `fd`'s file: a _Got, None when the daemon has no memory for it (ENOMEM), or
    _NO_DAEMON. A daemon from before gets into a kept memfd is asked again the old way."""
    sock = daemon_socket(fd)
    if sock is None:
        return _NO_DAEMON
    try:
        with sock:
            return _get(sock, fd, what, kept, ranges, gen)
    except BulkRefused as e:  # a daemon from before gets took a memfd: the get it knows
        if not (kept and e.errno == errno.EINVAL and "sends no descriptor" in str(e)):
            raise
    again = daemon_socket(fd)
    if again is None:
        return _NO_DAEMON
    with again:
        return _get(again, fd, what, False, ranges, gen)


def _get(sock: socket.socket, fd: int, what: str, kept: bool,
         ranges: list[tuple[int, int]] | None, gen: int | None) -> _Got | None:
    """The answer of a get on `sock`; None when the daemon has no memory for it (ENOMEM)."""
    memfds = part_memfds()
    size = os.fstat(fd).st_size
    want = size if ranges is None else min(size, sum(n for _o, n in ranges) + len(ranges) * WIDENED)
    taken = memfds.take_for(want) if kept else None  # None: the daemon makes a memfd
    memfd = -1 if taken is None else taken
    header: dict[str, Any] = {"op": "get", "fd": fd, "into": memfd >= 0}
    if ranges is not None:
        header["ranges"] = [[o, n] for o, n in fitted(ranges)]
    if gen is not None:
        header["gen"] = gen
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
    held = int(result["filled"]) if got_ranges is not None else int(result["size"])
    answered = (int(result["size"]), got_ranges, result.get("gen"), result.get("vid"))
    if memfd >= 0:
        for extra in fds:
            os.close(extra)
        return _Got(_KeptBytes(memfds, memfd, held), *answered)
    if len(fds) != 1:
        for extra in fds:
            os.close(extra)
        raise BulkRefused(errno.EIO, f"{what}: the cowfs daemon answered a get without its memfd")
    return _Got(os.fdopen(fds[0], "rb"), *answered)


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


def _windows(wanted: list[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    """Sorted, apart ranges as the windows to get them in: at most WINDOW bytes and MAX_SENT
    ranges each, filled in order (a range that does not fit goes on in the next window)."""
    out: list[list[tuple[int, int]]] = []
    window: list[tuple[int, int]] = []
    held = 0
    for off, n in wanted:
        while n > 0:
            if held == WINDOW or len(window) == MAX_SENT:
                out.append(window)
                window, held = [], 0
            take = min(n, WINDOW - held)
            window.append((off, take))
            held, off, n = held + take, off + take, n - take
    return out + [window] if window else out


def _windowed(fd: int, what: str, wanted: list[tuple[int, int]], size: int) -> BinaryIO:
    """`fd`'s file read through gets of its wanted ranges, one window at a time (the first got
    now, so that a refusal shows at open)."""
    windows = _windows(wanted)
    first = _fetch(fd, what, True, windows[0], None)
    if first is _NO_DAEMON:
        return os.fdopen(fd, "rb")
    if first is not None and first.ranges is None:  # a daemon from before ranges sent the whole file
        release_fd(fd)
        return cast(BinaryIO, first.file)
    return cast(BinaryIO, _WindowedBytes(fd, what, windows, size, first))


class _Held:
    """The bytes one get holds: the file's `ranges` ([offset, length], None: the whole file)
    back to back in `file`."""

    def __init__(self, got: _Got) -> None:
        self.file = got.file
        self.ranges: list[tuple[int, int, int]] = []  # (file offset, length, offset in file)
        at = 0
        for off, n in got.ranges if got.ranges is not None else [[0, got.size]]:
            self.ranges.append((int(off), int(n), at))
            at += int(n)

    def where(self, pos: int) -> tuple[int, int] | None:
        """(offset in `file`, bytes there) of the range holding `pos`; None outside them."""
        i = bisect.bisect_right(self.ranges, (pos, float("inf"))) - 1
        if i >= 0:
            off, n, at = self.ranges[i]
            if pos < off + n:
                return at + pos - off, off + n - pos
        return None

    def next_start(self, pos: int, end: int) -> int:
        """Where the first range after `pos` starts (`end` if none does before it)."""
        i = bisect.bisect_right(self.ranges, (pos, float("inf")))
        return min(end, self.ranges[i][0]) if i < len(self.ranges) else end


class _WindowedBytes(_Positioned):
    """A file read in its own offsets from gets of its wanted ranges a window (at most WINDOW
    bytes) at a time. The window read last, its two neighbours if they were read or got ahead,
    and no others are held: a reader that goes back and forth across a border (torch.load of an
    item that straddles it reads its end first) gets no window twice, and one that goes on in
    order finds the next window got already. Bytes outside the ranges are got on their own
    when read. Every get after the first asks for the generation the first one read (`gen`), so
    all of them read one version: a version gone since is ESTALE, and a daemon before
    generations that answers with another version fails the read with ESTALE too. A window the
    daemon has no memory for (ENOMEM) is read through the mount (`fd`, closed with the object)."""

    def __init__(self, fd: int, what: str, windows: list[list[tuple[int, int]]], size: int,
                 first: _Got | None) -> None:
        super().__init__(size)
        self._fd, self._what, self._windows = fd, what, windows
        self._spans = [(w[0][0], w[-1][0] + w[-1][1]) for w in windows]  # [lo, hi) of each window
        self._gen, self._vid = (first.gen, first.vid) if first is not None else (None, None)
        self._held: dict[int, _Held | None] = {0: _Held(first) if first is not None else None}  # None: via fd
        self._pool: ThreadPoolExecutor | None = None
        self._ahead: tuple[int, Future] | None = None  # a window being got in the background
        try:
            self._get_ahead(1)
        except BaseException:
            self._fd = -1  # its opener closes it: this object, collected later, must not
            raise

    def fileno(self) -> int:
        return self._fd

    def _answer(self, got: _Got) -> _Held:
        """A later get's bytes, once they are known to be of the version the first one read."""
        if self._vid is not None and got.vid is not None and got.vid != self._vid:
            got.file.close()
            raise OSError(errno.ESTALE, f"{self._what}: the file changed while it was read in windows")
        if self._vid is None:
            self._gen, self._vid = got.gen, got.vid
        return _Held(got)

    def _window(self, i: int) -> _Held | None:
        """Window `i`'s bytes (None: read them through the mount); windows not next to it given back."""
        if i not in self._held:
            if self._ahead is not None and self._ahead[0] == i:
                future, self._ahead = self._ahead[1], None
                got = future.result()
            else:
                got = _fetch(self._fd, self._what, True, self._windows[i], self._gen)
            self._held[i] = None if got is None or got is _NO_DAEMON else self._answer(got)
        for j in [j for j in self._held if abs(j - i) > 1]:
            gone = self._held.pop(j)
            if gone is not None:
                gone.file.close()  # (a kept memfd back, for the next window)
        if self._ahead is not None and (self._ahead[0] not in (i + 1, i + 2) or len(self._held) == 3):
            self._drop_ahead()  # (kept two ahead: a reader back in this window from the next goes on)
        self._get_ahead(i + 1)
        return self._held[i]

    def _get_ahead(self, i: int) -> None:
        """Window `i` got in the background while the one before is read (once the version is
        known: its generation is asked for); three windows held or got at most."""
        if (i >= len(self._windows) or i in self._held or self._gen is None or self._ahead is not None
                or len(self._held) == 3):
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="cowfs-get-ahead")
        self._ahead = (i, self._pool.submit(_fetch, self._fd, self._what, True, self._windows[i], self._gen))

    def _drop_ahead(self) -> None:
        """A window got ahead that is not wanted now: its memfd back (an error it met unsaid)."""
        if self._ahead is not None:
            future, self._ahead = self._ahead[1], None
            try:
                got = future.result()
            except Exception:
                return
            if isinstance(got, _Got):
                got.file.close()

    def _outside(self, pos: int, view: memoryview) -> int:
        """Bytes at `pos` that no window holds, got on their own."""
        view = view[:WINDOW]
        got = _fetch(self._fd, self._what, True, [(pos, len(view))], self._gen)
        if got is None or got is _NO_DAEMON:
            return os.preadv(self._fd, [view], pos)
        held = self._answer(got)
        try:
            at, n = held.where(pos) or (0, 0)
            held.file.seek(at)
            return held.file.readinto(view[:n])
        finally:
            held.file.close()

    def _read_at(self, pos: int, view: memoryview) -> int:
        """Some of the bytes at `pos` into `view` (0 only at the end)."""
        i = bisect.bisect_right(self._spans, (pos, float("inf"))) - 1
        if i >= 0 and pos < self._spans[i][1]:
            end = self._spans[i][1]
            held = self._window(i)
            if held is None:
                return os.preadv(self._fd, [view[:end - pos]], pos)
            where = held.where(pos)
            if where is not None:
                at, n = where
                held.file.seek(at)
                return held.file.readinto(view[:n])
            end = held.next_start(pos, end)
        else:
            end = self._spans[i + 1][0] if i + 1 < len(self._spans) else self._size
        return self._outside(pos, view[:end - pos])

    def readinto(self, buffer: Any) -> int:
        if self.closed:
            raise ValueError("read of a closed file")
        view = memoryview(buffer).cast("B")
        want = max(0, min(len(view), self._size - self._pos))
        done = 0
        while done < want:
            n = self._read_at(self._pos, view[done:want])
            if not n:
                break
            done += n
            self._pos += n
        return done

    def read(self, n: int = -1) -> bytes:  # type: ignore[override]
        if self.closed:
            raise ValueError("read of a closed file")
        end = self._size if n is None or n < 0 else min(self._size, self._pos + n)
        i = bisect.bisect_right(self._spans, (self._pos, float("inf"))) - 1
        held = self._window(i) if i >= 0 and self._pos < self._spans[i][1] else None
        where = held.where(self._pos) if held is not None else None
        if held is not None and where is not None and where[1] >= end - self._pos:  # within one range: one copy
            held.file.seek(where[0])
            data = held.file.read(end - self._pos)
            self._pos += len(data)
            return bytes(data)
        buf = bytearray(max(end - self._pos, 0))
        got = self.readinto(buf)
        return bytes(buf[:got])

    def readall(self) -> bytes:
        return self.read(-1)

    def close(self) -> None:
        if not self.closed:
            self._drop_ahead()
            if self._pool is not None:
                self._pool.shutdown()
            for held in self._held.values():
                if held is not None:
                    held.file.close()
            self._held = {}
            fd, self._fd = self._fd, -1
            if fd >= 0:
                release_fd(fd)
        super().close()
