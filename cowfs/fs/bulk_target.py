"""The file a bulk request is about (fs/bulk_server.py): the descriptor the client opened
through this mount, checked and turned into this mount's view and store inode."""
from __future__ import annotations

import errno
import fcntl
import os
import stat
from typing import TYPE_CHECKING

import trio

from ..errors import CowfsError

if TYPE_CHECKING:
    from .operations import CowfsOperations
    from .views import View


async def target_file(ops: "CowfsOperations", dev: int, fd: int, writing: bool) -> tuple[os.stat_result, "View", int]:
    """(stat, view, store inode) of `fd`, which must be a regular file of this mount (device
    `dev`) opened for writing (`writing`) or for reading. The kernel made the open's checks
    (permissions; EROFS for a snapshot opened for writing): the descriptor is the proof."""
    # a worker thread: a stat of a file of this mount may ask this very thread for its attributes
    st = await trio.to_thread.run_sync(os.fstat, fd)
    if st.st_dev != dev or not stat.S_ISREG(st.st_mode):
        raise CowfsError("the file descriptor is not a regular file of this cowfs mount", errno=errno.EXDEV)
    mode = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE
    if writing and mode == os.O_RDONLY:
        raise CowfsError("the file is not open for writing", errno=errno.EBADF)
    if not writing and mode == os.O_WRONLY:
        raise CowfsError("the file is not open for reading", errno=errno.EBADF)
    try:
        view, ino = ops.views.decode(st.st_ino)
    except KeyError:
        raise CowfsError("the file is no longer known to the mount", errno=errno.ENOENT) from None
    if writing and not view.live:
        raise CowfsError("a snapshot is read-only", errno=errno.EROFS)
    return st, view, ino
