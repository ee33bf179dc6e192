"""Stores and mounts for the benchmark: always unmounted, daemon waited for, and the
daemon's pid, CPU time and control socket at hand.

`cowfs mount` runs as a subprocess of this interpreter. With `writeback=False` the
daemon is started through a two-line launcher that turns the class attribute
`CowfsOperations.enable_writeback_cache` off before mounting; cowfs itself is not changed.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

from cowfs.control import DaemonTarget
from cowfs.mountinfo import mounted_cowfs, process_alive
from cowfs.store.layout import DEFAULT_DEVICE

NO_WRITEBACK_LAUNCHER = (
    "import sys\n"
    "from cowfs.fs.operations import CowfsOperations\n"
    "CowfsOperations.enable_writeback_cache = False\n"
    "from cowfs.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cowfs_cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    r = subprocess.run([sys.executable, "-m", "cowfs.cli", *args], capture_output=True, text=True,
                       timeout=timeout, stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        raise RuntimeError(f"cowfs {' '.join(args)} failed ({r.returncode}): {r.stderr.strip()}")
    return r


def init_store(path: Path, segment_size: str = "256M", device: str = DEFAULT_DEVICE) -> Path:
    cowfs_cli("init", str(path), "--segment-size", segment_size, "--device", device)
    return path


def daemon_pid(store: Path) -> int:
    return int((store / "lock").read_text().strip())


def cpu_seconds(pid: int) -> float:
    """utime + stime of every thread of `pid` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # fields 14 and 15 of stat(5)


def spilled_bytes(pid: int) -> int:
    """Bytes in the daemon's open overlay spill files (unlinked STORE/tmp/spill-*): what a write
    session received out of order and will chunk only at commit (docs/design.md, "Freeze")."""
    total = 0
    fd_dir = f"/proc/{pid}/fd"
    for fd in os.listdir(fd_dir):
        try:
            target = os.readlink(f"{fd_dir}/{fd}")
            if "/tmp/spill-" in target:
                total += os.stat(f"{fd_dir}/{fd}").st_size
        except OSError:
            continue
    return total


def drop_caches() -> bool:
    """Write dirty pages back and drop the page cache (root only). False if not allowed."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


class Mount:
    """A live mount of `store` on `mnt`: its daemon pid and a control-socket client."""

    def __init__(self, store: Path, mnt: Path, pid: int) -> None:
        self.store, self.mnt, self.pid = store, mnt, pid
        self._target: DaemonTarget | None = None

    def call(self, op: str, **args: Any) -> Any:
        if self._target is None:
            self._target = DaemonTarget(self.store)
        return self._target.call(op, **args)

    def stats(self) -> dict[str, Any]:
        return dict(self.call("stats"))

    def cpu(self) -> float:
        return cpu_seconds(self.pid)

    def spilled(self) -> int:
        return spilled_bytes(self.pid)

    def close_client(self) -> None:
        if self._target is not None:
            self._target.close()
            self._target = None


@contextlib.contextmanager
def mounted(store: Path, mnt: Path, writeback: bool = True) -> Iterator[Mount]:
    """Mount for the body of the with-block; unmount and reap the daemon however it ends."""
    mnt.mkdir(parents=True, exist_ok=True)
    if writeback:
        cowfs_cli("mount", str(store), str(mnt))
    else:
        r = subprocess.run([sys.executable, "-c", NO_WRITEBACK_LAUNCHER, "mount", str(store), str(mnt)],
                           capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
        if r.returncode != 0:
            raise RuntimeError(f"mount without writeback cache failed: {r.stderr.strip()}")
    m = Mount(store, mnt, daemon_pid(store))
    try:
        yield m
    finally:
        m.close_client()
        unmount(mnt, m.pid)


def unmount(mnt: Path, pid: int) -> None:
    if str(mnt) in mounted_cowfs():
        r = subprocess.run([sys.executable, "-m", "cowfs.cli", "umount", str(mnt)], capture_output=True,
                           text=True, timeout=300, stdin=subprocess.DEVNULL)
        if r.returncode != 0:
            print(f"bench: cowfs umount {mnt} failed: {r.stderr.strip()}; lazy unmount", file=sys.stderr)
            subprocess.run(["fusermount3", "-u", "-z", str(mnt)], capture_output=True)
    deadline = time.monotonic() + 60
    while process_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if process_alive(pid):  # our own daemon (pid from the store we mounted), stuck
        os.kill(pid, signal.SIGKILL)
        subprocess.run(["fusermount3", "-u", "-z", str(mnt)], capture_output=True)
