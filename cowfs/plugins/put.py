"""Puts: a file's new bytes to a cowfs mount's daemon in sealed memfds, committed durably as one
new version, without FUSE requests for the bytes (fs/put_op.py).

`PutStream` is the file object the bytes are written into. They go into a memfd; each time
PART_BYTES have gathered, the part is sealed (`F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE`)
and sent at once, so the daemon cuts, hashes and writes it while the writer makes the next.
The first part sent opens the file through the mount for writing (O_CREAT, without
O_TRUNC): the kernel checks permissions and refuses snapshots as for any open, and the
descriptor, named by its number in that part's header, is the proof the daemon asks for
(it reads the descriptor's flags, mount and inode in this process's /proc fdinfo). A file smaller than a
part is opened only once all its bytes are ready, so a writer killed while it made them
leaves nothing behind. `finish` sends the last part and waits for the daemon's reply, which
comes once the new version is durable. Where the path is not on a cowfs mount, or its daemon
has no bulk socket, the parts are written through the descriptor and fsynced: the same
result the slow way.
"""
from __future__ import annotations

import fcntl
import io
import os
import socket
from typing import BinaryIO, Callable

from .bulk import BulkRefused, daemon_socket, receive_reply, send

SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
PART_BYTES = 32 << 20  # bytes per part: the daemon starts on a part while the next one is made
WRITE_BUFFER = 1 << 20
PutRefused = BulkRefused  # the name puts raised before gets shared the socket


def new_memfd() -> int:
    return os.memfd_create("cowfs-put", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)


def open_for_put(path: str | os.PathLike, mode: int = 0o666) -> tuple[int, bool]:
    """The file opened for writing (created if missing: then True), without truncating it."""
    try:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode), True
    except FileExistsError:
        return os.open(path, os.O_WRONLY | os.O_CLOEXEC), False


def unlink_quietly(path: str | os.PathLike) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


class PutStream(io.RawIOBase):
    """The new bytes of `path`, written in order (see the module docstring). `finish()` makes
    them its new version (True: a cowfs daemon took them); `abort()` (or closing without
    finishing) drops them and leaves the file as it was. Not thread-safe."""

    def __init__(self, path: str | os.PathLike, mode: int = 0o666, part_bytes: int | None = None) -> None:
        super().__init__()
        self.path, self._mode, self._part_bytes = path, mode, part_bytes or PART_BYTES
        self._memfd = new_memfd()
        self._in_part = 0  # bytes in the current part
        self._pos = 0  # bytes written
        self._fd = -1
        self._created = False
        self._sock: socket.socket | None = None
        self._parts_sent = 0
        self._done = False

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def fileno(self) -> int:
        """The current part's memfd (an fsync of it costs nothing; the put is durable)."""
        return self._memfd

    def write(self, data: bytes | bytearray | memoryview) -> int:  # type: ignore[override]
        if self._done or self._memfd < 0:
            raise ValueError("write to a finished or dropped put")
        view = memoryview(data).cast("B")
        n = len(view)
        while view:
            k = os.write(self._memfd, view[:self._part_bytes - self._in_part])
            self._in_part += k
            self._pos += k
            view = view[k:]
            if self._in_part >= self._part_bytes:
                self._ship(more=True)
        return n

    def _ship(self, more: bool) -> None:
        """Seal the current part and send it (or write it through the file); a new one follows
        if `more`."""
        fcntl.fcntl(self._memfd, fcntl.F_ADD_SEALS, SEALS)
        if self._fd < 0:
            self._fd, self._created = open_for_put(self.path, self._mode)
            self._sock = daemon_socket(self._fd)
            if self._sock is None:
                os.ftruncate(self._fd, 0)
        if self._sock is None:
            sent = 0
            while sent < self._in_part:  # at the file's position (sendfile: also across file systems)
                sent += os.sendfile(self._fd, self._memfd, sent, self._in_part - sent)
        else:
            header = {"size": self._in_part, "more": more}
            if not self._parts_sent:  # the file: this process's descriptor, by number (fs/bulk_target.py)
                header = {"op": "put", "fd": self._fd, **header}
            try:
                send(self._sock, header, [self._memfd])
            except (BrokenPipeError, ConnectionResetError):  # the daemon refused an earlier part: say why
                receive_reply(self._sock, os.fspath(self.path))
                raise
        self._parts_sent += 1
        os.close(self._memfd)
        self._memfd = new_memfd() if more else -1
        self._in_part = 0

    def send_last(self) -> None:
        """Send the last part; `wait` then waits for the commit."""
        self._ship(more=False)
        self._done = True

    def wait(self) -> bool:
        """Wait for the commit of what `send_last` sent: True when a cowfs daemon took the
        bytes, False when they were written through the file (and fsynced now). Raises OSError
        (BulkRefused from the daemon); the file then keeps its last version."""
        try:
            if self._sock is None:
                os.fsync(self._fd)
                return False
            receive_reply(self._sock, os.fspath(self.path))
            return True
        except BaseException:
            self._drop_file()
            raise
        finally:
            self._release()

    def finish(self) -> bool:
        """send_last, then wait."""
        try:
            self.send_last()
        except BaseException:
            self.abort()
            raise
        return self.wait()

    def abort(self) -> None:
        """Drop the bytes: nothing is committed (a daemon aborts the put when its connection
        closes before the last part), and a file this put created is removed."""
        if not self._done:
            self._done = True
            self._drop_file()
        self._release()

    def _drop_file(self) -> None:
        if self._created:
            unlink_quietly(self.path)
            self._created = False

    def _release(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        for fd in (self._memfd, self._fd):
            if fd >= 0:
                os.close(fd)
        self._memfd = self._fd = -1

    def close(self) -> None:
        if not self.closed:
            if not self._done or self._fd >= 0 or self._memfd >= 0:
                self.abort()
        super().close()


def write_all(stream: PutStream, fill: Callable[[BinaryIO], None]) -> None:
    """What `fill` writes into a buffered file object, into `stream` (all of it, flushed);
    `stream` aborted if `fill` fails."""
    buffered = io.BufferedWriter(stream, WRITE_BUFFER)
    try:
        fill(buffered)  # type: ignore[arg-type]
        buffered.flush()
    except BaseException:
        stream.abort()
        raise
    finally:
        try:
            buffered.detach()
        except ValueError:
            pass


def put(path: str | os.PathLike, fill: Callable[[BinaryIO], None], mode: int = 0o666) -> bool:
    """Make `path`'s content what `fill` writes into the file object it is given, durably and
    as one new version. True when a cowfs daemon took the bytes, False when they were written
    through the file (not a cowfs mount). Raises OSError (BulkRefused from the daemon) and
    leaves the file as it was when anything fails."""
    stream = PutStream(path, mode)
    write_all(stream, fill)
    return stream.finish()
