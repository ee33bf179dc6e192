"""Who still holds a file open: /proc/PID/fdinfo, read without touching the mount.

pyfuse3 hands `flush()` neither the caller's pid nor the lock owner, so a FLUSH
from a close of a *copy* of the writer's descriptor (a child forked while the
file was open, closing it or exec'ing) looks like the writer's own close. The
writer's own close removes its descriptor before FLUSH is sent; a copy's close
does not. So: if the process that opened the handle still holds a writable
descriptor on this inode of this mount, the FLUSH came from elsewhere.

`fd_info` reads one descriptor's flags, mount and inode the same way: the bulk socket names
the client's file by descriptor number (fs/bulk_target.py).
"""
from __future__ import annotations

import os

from ..mountinfo import mount_fields


def mount_id(mountpoint: str) -> int | None:
    """The kernel's mount id of `mountpoint` (first field of /proc/self/mountinfo)."""
    fields = mount_fields(mountpoint)  # the last one: it is on top
    return int(fields[0]) if fields else None


def holds_writable(pid: int, mnt_id: int, ino: int) -> bool:
    """Does process `pid` hold a descriptor open for writing on inode `ino` of mount `mnt_id`?
    (Raw os calls and bytes: a FLUSH pays this for every descriptor of the opener.)"""
    base = f"/proc/{pid}/fdinfo/"
    try:
        fds = os.listdir(base)
    except OSError:
        return False  # gone
    # fdinfo starts with "pos:", so both lines we look for follow a newline
    want_mnt, want_ino = b"\nmnt_id:\t%d\n" % mnt_id, b"\nino:\t%d\n" % ino
    for fd in fds:
        try:
            h = os.open(base + fd, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue  # closed meanwhile
        try:
            info = os.read(h, 4096)
        except OSError:
            continue
        finally:
            os.close(h)
        if want_mnt not in info or want_ino not in info:
            continue
        _, found, rest = info.partition(b"\nflags:\t")
        if found and int(rest.split(b"\n", 1)[0], 8) & os.O_ACCMODE in (os.O_WRONLY, os.O_RDWR):
            return True
    return False


def fd_info(pid: int, fd: int) -> tuple[int, int, int] | None:
    """(flags, mount id, inode) of descriptor `fd` of process `pid`, from its fdinfo: read without
    touching the file or its mount. None if it cannot be read (no such descriptor or process,
    or not ours to read)."""
    try:
        h = os.open(f"/proc/{pid}/fdinfo/{fd}", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        info = os.read(h, 4096)
    except OSError:
        return None
    finally:
        os.close(h)
    fields = dict(line.split(b":\t", 1) for line in info.split(b"\n") if b":\t" in line)
    try:
        return int(fields[b"flags"], 8), int(fields[b"mnt_id"]), int(fields[b"ino"])
    except (KeyError, ValueError):
        return None
