"""Real mounts for tests: a context manager that always unmounts and stops its daemon."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

from cowfs.mountinfo import mount_fields, mounted_cowfs, process_alive

import pytest

from tests.support.storeutil import assert_clean, new_store


@pytest.fixture
def store_path(tmp_path: Path) -> Iterator[Path]:
    """Path of a new store for a mount test (16 MiB segments), fsck'ed clean after the test.
    The fixture of the mount and harness layers (their conftest.py imports it)."""
    p = new_store(tmp_path / "store", segment_size=16 << 20)
    yield p
    assert_clean(p)


def cowfs(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "cowfs.cli", *args], capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
    if check and r.returncode != 0:
        raise AssertionError(f"cowfs {' '.join(args)} failed ({r.returncode}): {r.stderr.decode()}")
    return r


def daemon_pid(store: Path) -> int:
    return int((store / "lock").read_text().strip())


def read_ahead_kib(mnt: Path) -> int:
    """The kernel's read-ahead for a mount (its backing device info, found in mountinfo)."""
    fields = mount_fields(mnt)
    assert fields is not None, f"{mnt} is not mounted"
    with open(f"/sys/class/bdi/{fields[2]}/read_ahead_kb") as f:
        return int(f.read())


def force_unmount(mnt: Path) -> None:
    """Best effort, for cleanup after a failure or a kill -9: lazy unmount."""
    if str(mnt) in mounted_cowfs():
        subprocess.run(["fusermount3", "-u", "-z", str(mnt)], capture_output=True)


@contextlib.contextmanager
def mounted(store: Path, mnt: Path, *extra: str) -> Iterator[Path]:
    """Mount `store` on `mnt` (created if missing) for the body; unmount however the body ends."""
    mnt.mkdir(exist_ok=True)
    if not any(a.startswith("--compact-idle") for a in extra):  # tests that count stored bytes
        extra = (*extra, "--compact-idle", "off")            # must not see a compaction midway
    cowfs("mount", str(store), str(mnt), *extra)
    with reaped(store, mnt):
        yield mnt


@contextlib.contextmanager
def reaped(store: Path, mnt: Path) -> Iterator[None]:
    """For the body: `store` is mounted on `mnt` by a daemon already started; afterwards it
    is unmounted and its daemon waited for (killed after 30 s), however the body ends."""
    pid = daemon_pid(store)
    try:
        yield
    finally:
        if str(mnt) in mounted_cowfs():
            r = cowfs("umount", str(mnt), check=False)
            if r.returncode != 0:
                force_unmount(mnt)
        deadline = time.monotonic() + 30
        while process_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if process_alive(pid):
            os.kill(pid, signal.SIGKILL)
            force_unmount(mnt)


def kill9(store: Path, mnt: Path) -> None:
    """kill -9 the daemon of `store` and lazily unmount what it leaves behind."""
    pid = daemon_pid(store)
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while process_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    force_unmount(mnt)


__all__ = ["assert_clean", "cowfs", "kill9", "mounted", "reaped", "force_unmount", "daemon_pid", "store_path"]


@contextlib.contextmanager
def small_fs(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` mounted on `path` for the body; always unmounted afterwards."""
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)
