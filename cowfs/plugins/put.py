"""Puts: a file's new bytes to a cowfs mount's daemon in memfds, committed durably as one new
version, without FUSE requests for the bytes (fs/put_op.py).

`PutStream` is the file object the bytes are written into. They go into a memfd, one per
part of PART_BYTES; each full part is sent at once (or, with `hold`, every part once the
last is written), so the daemon cuts, hashes and writes it while the writer makes the next.
The memfds are the process's kept ones where it keeps any (part_memfds.py: their pages
made by an earlier put, so writing into them is a copy only), given back once the daemon
has answered, and the daemon copies their bytes before it uses them; past that bound a
part is a new memfd, sealed (`F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE`) before it is
sent, which the daemon reads in place.
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

from .bulk import BulkRefused, daemon_socket, receive_reply, release_fd, send
from .part_memfds import part_memfds

SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
PART_BYTES = 32 << 20  # bytes per part: the daemon starts on a part while the next one is made
WRITE_BUFFER = 1 << 20
PutRefused = BulkRefused  # the name puts raised before gets shared the socket


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


class _Part:
    """One part's memfd and how many bytes it holds; `kept`: a memfd of part_memfds, given
    back after the daemon's reply (else sealed before it is sent, and closed)."""

    __slots__ = ("fd", "kept", "size")

    def __init__(self, fd: int, kept: bool) -> None:
        self.fd, self.kept, self.size = fd, kept, 0


class PutStream(io.RawIOBase):
    """The new bytes of `path`, written in order (see the module docstring). `finish()` makes
    them its new version (True: a cowfs daemon took them); `abort()` (or closing without
    finishing) drops them and leaves the file as it was. `hold`: the parts go to the daemon
    only once the last is written. Not thread-safe."""

    def __init__(self, path: str | os.PathLike, mode: int = 0o666, part_bytes: int | None = None,
                 hold: bool = False) -> None:
        super().__init__()
        self.path, self._mode, self._part_bytes, self._hold = path, mode, part_bytes or PART_BYTES, hold
        self._memfds = part_memfds()
        self._part: _Part | None = self._new_part()
        self._pos = 0  # bytes written
        self._fd = -1
        self._created = False
        self._sock: socket.socket | None = None
        self._held: list[_Part] = []  # full parts not sent yet (hold)
        self._sent: list[_Part] = []  # parts the daemon may read until it replies
        self._replied = False
        self._done = False

    def _new_part(self) -> _Part:
        return _Part(*self._memfds.take(self._part_bytes))

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def fileno(self) -> int:
        """The current part's memfd (an fsync of it costs nothing; the put is durable)."""
        if self._part is None:
            raise ValueError("fileno of a finished or dropped put")
        return self._part.fd

    def write(self, data: bytes | bytearray | memoryview) -> int:  # type: ignore[override]
        part = self._part
        if self._done or part is None:
            raise ValueError("write to a finished or dropped put")
        view = memoryview(data).cast("B")
        n = len(view)
        while view:  # (pwrite: a kept memfd's file offset is where its last put left it)
            k = os.pwrite(part.fd, view[:self._part_bytes - part.size], part.size)
            part.size += k
            self._pos += k
            view = view[k:]
            if part.size >= self._part_bytes:
                self._part = None
                if self._hold:
                    self._held.append(part)
                else:
                    self._ship_or_hold(part, more=True)
                part = self._part = self._new_part()
        return n

    def _ship_or_hold(self, part: _Part, more: bool) -> None:
        """_ship; a part it failed to send is held (never read by a daemon: given back by abort)."""
        try:
            self._ship(part, more)
        except BaseException:
            if part not in self._sent:
                self._held.append(part)
            raise

    def _ship(self, part: _Part, more: bool) -> None:
        """Send a part (or write it through the file)."""
        if not part.kept:
            fcntl.fcntl(part.fd, fcntl.F_ADD_SEALS, SEALS)
        if self._fd < 0:
            self._fd, self._created = open_for_put(self.path, self._mode)
            self._sock = daemon_socket(self._fd)
            if self._sock is None:
                os.ftruncate(self._fd, 0)
        if self._sock is None:
            sent = 0
            while sent < part.size:  # at the file's position (sendfile: also across file systems)
                sent += os.sendfile(self._fd, part.fd, sent, part.size - sent)
            self._let_go(part, reusable=True)
            return
        header = {"size": part.size, "more": more}
        if not self._sent:  # the file: this process's descriptor, by number (fs/bulk_target.py)
            header = {"op": "put", "fd": self._fd, **header}
        self._sent.append(part)
        try:
            send(self._sock, header, [part.fd])
        except (BrokenPipeError, ConnectionResetError):  # the daemon refused an earlier part: say why
            self._replied = True  # (a reply, or a daemon gone: either way nothing reads the parts now)
            receive_reply(self._sock, os.fspath(self.path))
            raise

    def _let_go(self, part: _Part, reusable: bool) -> None:
        if not part.kept:
            os.close(part.fd)
        elif reusable:
            self._memfds.give(part.fd)
        else:
            self._memfds.drop(part.fd)

    def send_last(self) -> None:
        """Send the last part (and the held ones before it); `wait` then waits for the commit."""
        last, self._part = self._part, None
        self._done = True
        if last is None:
            raise ValueError("send_last of a finished or dropped put")
        parts, self._held = [*self._held, last], []
        for i, part in enumerate(parts):
            try:
                self._ship_or_hold(part, more=i + 1 < len(parts))
            except BaseException:
                self._held += parts[i + 1:]  # never sent: given back by abort
                raise

    def wait(self) -> bool:
        """Wait for the commit of what `send_last` sent: True when a cowfs daemon took the
        bytes, False when they were written through the file (and fsynced now). Raises OSError
        (BulkRefused from the daemon); the file then keeps its last version."""
        try:
            if self._sock is None:
                os.fsync(self._fd)
                return False
            try:
                receive_reply(self._sock, os.fspath(self.path))
            except BulkRefused:
                self._replied = True  # (or the daemon closed the socket: it reads nothing more either)
                raise
            self._replied = True
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
        """Everything let go, each once: the fields are emptied before anything is closed, so
        that an error here and a later close() never close one descriptor twice."""
        sock, self._sock = self._sock, None
        sent, held, last, self._sent, self._held, self._part = self._sent, self._held, self._part, [], [], None
        fd, self._fd = self._fd, -1
        try:
            if sock is not None:
                sock.close()
            for part in sent:  # without a reply the daemon may still read them: not written again
                self._let_go(part, reusable=self._replied)
            for part in held:  # never sent
                self._let_go(part, reusable=True)
            if last is not None:
                self._let_go(last, reusable=True)
        finally:
            if fd >= 0:
                release_fd(fd)

    def close(self) -> None:
        if not self.closed:
            if not self._done or self._fd >= 0 or self._part is not None or self._sent or self._held:
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
