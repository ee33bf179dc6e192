"""`open_read(path)`: a file's committed bytes as a read-only file object, handed over by the
cowfs mount's daemon in a sealed memfd, without FUSE READs (fs/get_op.py).

The file is opened for reading through the mount first, so the kernel checks permissions as
for any open; the descriptor, named by its number, is the proof the daemon asks for (it reads
the descriptor's flags, mount and inode in this process's /proc fdinfo). The daemon reads the version
that open gets, checks every chunk as every read is, and answers with a memfd of its bytes
sealed against any change: the file object reads it, and `torch.load(..., mmap=True)` maps
it (through /proc/self/fd). Where the path is not on a cowfs mount, its daemon takes no
gets, or the file is too large for memory (the daemon says ENOMEM), the file object is the
file itself, read through the mount.
"""
from __future__ import annotations

import errno
import os
from typing import BinaryIO

from .bulk import BulkRefused, daemon_socket, request


def is_memfd(fd: int) -> bool:
    """Whether `fd` is a memfd (what a get hands over)."""
    return os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:")


def open_read(path: str | os.PathLike) -> BinaryIO:
    """`path`'s bytes, read-only (see the module docstring). Raises OSError (BulkRefused, EIO
    for a damaged chunk) as a read would."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        sock = daemon_socket(fd)
        if sock is not None:
            with sock:
                try:
                    _result, fds = request(sock, {"op": "get", "fd": fd}, [], os.fspath(path))
                except BulkRefused as e:
                    if e.errno != errno.ENOMEM:
                        raise
                    fds = []
            if len(fds) == 1:
                os.close(fd)
                fd = fds[0]
            else:
                for extra in fds:
                    os.close(extra)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
