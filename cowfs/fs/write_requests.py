"""The size of the kernel's WRITE requests: the largest that libfuse can receive by splice.

libfuse (3.14) receives a request by splice(2), moving its pages into a pipe of its own,
only when that pipe holds the largest request and a 4 KiB page for its header; otherwise it
read(2)s the request into a buffer, and pyfuse3 then copies a WRITE's bytes out of that
buffer once more. With libfuse's own largest request, 1 MiB, the pipe must hold 1 MiB +
4 KiB, which the kernel rounds up to 2 MiB; a process may make a pipe that large only when
`fs.pipe-max-size` allows it (the default is 1 MiB) or with CAP_SYS_RESOURCE. So unless this
process may make such a pipe, the mount asks the kernel for requests one page smaller than
the largest pipe it may make (1020 KiB under the default), which libfuse then splices: one
copy less of every byte written, on the FUSE thread (docs/benchmarks.md, "WRITE requests
that libfuse splices"). pyfuse3 passes the size on only in cowfs's build of it
(native/pyfuse3/cowfs.patch, `Operations.max_write`).
"""
from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Callable

F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
PAGE = os.sysconf("SC_PAGE_SIZE")
HEADER = 4096  # libfuse's room for a request's header (FUSE_BUFFER_HEADER_SIZE)
LIBFUSE_LARGEST = 1 << 20  # libfuse 3.14's largest request: 256 pages
LIBFUSE_PIPE = 2 << 20  # the pipe that takes it and its header (the kernel rounds pipes to powers of two)
SMALLEST = 128 << 10  # below this, more requests would cost more than the copy saved
PIPE_LIMIT = Path("/proc/sys/fs/pipe-max-size")


def pipe_can_hold(size: int) -> bool:
    """Whether this process may make a pipe of at least `size` bytes."""
    if size >= 1 << 31:  # past what F_SETPIPE_SZ takes (an int)
        return False
    r, w = os.pipe()
    try:
        fcntl.fcntl(r, F_SETPIPE_SZ, size)
        return True
    except OSError:
        return False
    finally:
        os.close(r)
        os.close(w)


def pipe_limit() -> int | None:
    """fs.pipe-max-size, or None when it cannot be read."""
    try:
        return int(PIPE_LIMIT.read_text())
    except (OSError, ValueError):
        return None


def libfuse_splices(can_hold: Callable[[int], bool] = pipe_can_hold) -> bool:
    """Whether libfuse can splice its own largest requests here (a pipe of 1 MiB + 4 KiB)."""
    return can_hold(LIBFUSE_LARGEST + HEADER)


def spliced_max_write(can_hold: Callable[[int], bool] = pipe_can_hold, limit: int | None = None) -> int:
    """The max_write to ask of the kernel: 0 (libfuse's own 1 MiB) when libfuse can splice
    requests of that size here; else the largest whole-page size whose request and header
    fit a pipe this process may make (`limit`: fs.pipe-max-size, read when None); 0 when
    that is below SMALLEST, or when no such pipe can be made."""
    if libfuse_splices(can_hold):
        return 0
    if limit is None:
        limit = pipe_limit()
    if limit is None:
        return 0
    # pipes come in powers of two of pages: the largest one under the limit
    pipe = PAGE
    while pipe * 2 <= limit:
        pipe *= 2
    size = min(pipe - HEADER, LIBFUSE_LARGEST) // PAGE * PAGE
    if size < SMALLEST or not can_hold(size + HEADER):
        return 0
    return size
