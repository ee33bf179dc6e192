"""Who still holds a file open: /proc/PID/fdinfo, read without touching the mount.

pyfuse3 hands `flush()` neither the caller's pid nor the lock owner, so a FLUSH
from a close of a *copy* of the writer's descriptor (a child forked while the
file was open, closing it or exec'ing) looks like the writer's own close. The
writer's own close removes its descriptor before FLUSH is sent; a copy's close
does not. So: if the process that opened the handle still holds a writable
descriptor on this inode of this mount, the FLUSH came from elsewhere.
"""
from __future__ import annotations

import os

from ..mountinfo import mount_fields


def mount_id(mountpoint: str) -> int | None:
    """The kernel's mount id of `mountpoint` (first field of /proc/self/mountinfo)."""
    fields = mount_fields(mountpoint)  # the last one: it is on top
    return int(fields[0]) if fields else None


def holds_writable(pid: int, mnt_id: int, ino: int) -> bool:
    """Does process `pid` hold a descriptor open for writing on inode `ino` of mount `mnt_id`?"""
    base = f"/proc/{pid}/fdinfo"
    try:
        fds = os.listdir(base)
    except OSError:
        return False  # gone
    want_mnt, want_ino = f"mnt_id:\t{mnt_id}\n", f"ino:\t{ino}\n"
    for fd in fds:
        try:
            with open(f"{base}/{fd}") as f:
                info = f.read()
        except OSError:
            continue
        if want_mnt not in info or want_ino not in info:
            continue
        for line in info.splitlines():
            if line.startswith("flags:"):
                if int(line.split()[1], 8) & os.O_ACCMODE in (os.O_WRONLY, os.O_RDWR):
                    return True
    return False
