"""Facts about live cowfs mounts and their daemons, read from the kernel and the store.

No FUSE here: the CLI, the daemon, the harnesses in tools/ and the tests all
ask these questions without importing pyfuse3 or trio.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

from .store.log.layout import LOCK_FILE

FSNAME_PREFIX = "cowfs:"  # the fsname of a mount is FSNAME_PREFIX + the store's path
FS_TYPE = "fuse.cowfs"


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal (\\040 ...)."""
    return field.encode().decode("unicode_escape")


def mounted_cowfs() -> dict[str, str]:
    """Mountpoint -> store path of every live cowfs mount (from /proc/self/mountinfo)."""
    out = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields = right.split()
            if len(fields) >= 2 and fields[0] == FS_TYPE and fields[1].startswith(FSNAME_PREFIX):
                out[_unescape(left.split()[4])] = _unescape(fields[1][len(FSNAME_PREFIX):])
    return out


def mount_fields(mountpoint: str | Path) -> list[str] | None:
    """The mountinfo fields (before ' - ') of the mount at `mountpoint`, the last one if stacked."""
    found = None
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            if _unescape(fields[4]) == str(mountpoint):
                found = fields
    return found


def daemon_pid(store: Path) -> int | None:
    """The pid the process holding the store wrote into its lock file (None if none)."""
    try:
        text = (store / LOCK_FILE).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def process_alive(pid: int) -> bool:
    """Whether process `pid` exists and has not exited (a zombie waiting to be reaped counts
    as exited). Every thread counts: a process whose main thread has ended shows as a zombie
    while its other threads still exit, holding its descriptors (a store's catalog and its
    locks). Used by umount and by the test and benchmark harnesses."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                if f.read().rsplit(") ", 1)[1][0] not in "ZX":
                    return True
        except (OSError, IndexError):
            continue  # (that thread is gone)
    return False


def lazy_unmount(mountpoint: str | Path) -> bool:
    """`fusermount3 -u -z`: detach a mount whose daemon is gone (or must go). True if it worked."""
    r = subprocess.run(["fusermount3", "-u", "-z", str(mountpoint)], check=False, capture_output=True)
    return r.returncode == 0


def _devices() -> dict[int, tuple[str, list[str]]]:
    """st_dev -> (mountpoint, super options) of every mount (/proc/self/mountinfo's
    major:minor field, and the fields after ' - ')."""
    out: dict[int, tuple[str, list[str]]] = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields = left.split()
            major, _, minor = fields[2].partition(":")
            out[os.makedev(int(major), int(minor))] = (_unescape(fields[4]), right.split())
    return out


def mount_device(mountpoint: str | Path) -> int | None:
    """The st_dev of the files of the mount at `mountpoint`, without a stat through it (the
    daemon asks about its own mount: a stat would wait for the daemon)."""
    fields = mount_fields(mountpoint)
    if fields is None:
        return None
    major, _, minor = fields[2].partition(":")
    return os.makedev(int(major), int(minor))


def cowfs_mount_owner(st_dev: int) -> int | None:
    """The uid that mounted the cowfs mount whose files have device `st_dev` (FUSE's user_id=
    option), or None when that device is not a cowfs mount."""
    found = _devices().get(st_dev)
    if found is None or len(found[1]) < 3 or found[1][0] != FS_TYPE:
        return None
    for opt in found[1][2].split(","):
        if opt.startswith("user_id="):
            return int(opt[len("user_id="):])
    return None
