"""`put(path, fill)`: a file's new bytes to a cowfs mount's daemon in a sealed memfd, committed
durably as one new version, without FUSE requests for the bytes (fs/put_op.py).

The file is opened for writing through the mount (O_CREAT, without O_TRUNC), so the kernel checks permissions and refuses snapshots as for any open; the descriptor is the
proof the daemon asks for. Its bytes go into a memfd first (`fill_memfd`: the copy into host
memory, all a background save waits for), which is sealed; then the file is opened and both
are sent (`put_memfd`).
The daemon's reply comes once the new version is durable; closing the descriptor then
commits nothing more. Where the path is not on a cowfs mount, or its daemon takes no puts,
the bytes are written through the descriptor and fsynced: the same result the slow way.
"""
from __future__ import annotations

import fcntl
import io
import os
from typing import BinaryIO, Callable

from .bulk import BulkRefused, daemon_socket, request

SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
PutRefused = BulkRefused  # the name puts raised before gets shared the socket


def fill_memfd(fill: Callable[[BinaryIO], None]) -> int:
    """A sealed memfd holding what `fill` writes into the file object it is given."""
    memfd = os.memfd_create("cowfs-put", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        with io.FileIO(memfd, "wb", closefd=False) as raw, io.BufferedWriter(raw, 1 << 20) as f:
            fill(f)
        fcntl.fcntl(memfd, fcntl.F_ADD_SEALS, SEALS)
    except BaseException:
        os.close(memfd)
        raise
    return memfd


def send_memfd(fd: int, memfd: int, what: str) -> bool:
    """Make the sealed memfd's bytes the new version of the file open for writing as `fd`,
    durably. True when the cowfs daemon took them; False when they were written through `fd`
    and fsynced (not a cowfs mount, or no bulk socket)."""
    sock = daemon_socket(fd)
    if sock is None:
        os.ftruncate(fd, 0)
        size = os.fstat(memfd).st_size
        off = 0
        while off < size:  # (sendfile: any two files, also on two file systems)
            off += os.sendfile(fd, memfd, off, size - off)
        os.fsync(fd)
        return False
    with sock:
        request(sock, {"op": "put", "size": os.fstat(memfd).st_size}, [fd, memfd], what)
    return True


def open_for_put(path: str | os.PathLike, mode: int = 0o666) -> tuple[int, bool]:
    """The file opened for writing (created if missing: then True), without truncating it."""
    try:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode), True
    except FileExistsError:
        return os.open(path, os.O_WRONLY | os.O_CLOEXEC), False


def put(path: str | os.PathLike, fill: Callable[[BinaryIO], None], mode: int = 0o666) -> bool:
    """Make `path`'s content what `fill` writes into the file object it is given, durably and
    as one new version. True when a cowfs daemon took the bytes, False when they were written
    through the file (not a cowfs mount). Raises OSError (BulkRefused from the daemon) and
    leaves the file as it was when anything fails."""
    memfd = fill_memfd(fill)
    try:
        return put_memfd(path, memfd, mode)
    finally:
        os.close(memfd)


def put_memfd(path: str | os.PathLike, memfd: int, mode: int = 0o666) -> bool:
    """Make the sealed memfd's bytes `path`'s new version, durably (as `put`). The file is
    opened (created if missing) only now, with its bytes ready: a process killed while it
    made them leaves no empty file behind; one that fails here removes the file it created."""
    fd, created = open_for_put(path, mode)
    try:
        return send_memfd(fd, memfd, os.fspath(path))
    except BaseException:
        if created:
            unlink_quietly(path)
        raise
    finally:
        os.close(fd)


def unlink_quietly(path: str | os.PathLike) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
