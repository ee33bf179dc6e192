"""Stores and mounts for the benchmark: always unmounted, daemon waited for, and the
daemon's pid, CPU time and control socket at hand.

`cowfs mount` runs as a subprocess of this interpreter, without the kernel's writeback
cache unless `writeback=True` (`--writeback-cache`), as `cowfs mount` does by default, and
with idle compaction off unless `compact_idle` says otherwise (`--compact-idle`): the
benchmark compacts when it means to (`cowfs compact`), so the save figures of the series
never share the machine with a compaction the daemon started by itself.
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, Iterator

from cowfs.control import DaemonTarget
from cowfs.mountinfo import daemon_pid, lazy_unmount, mounted_cowfs, process_alive
from cowfs.store.log.layout import DEFAULT_DEVICE
from tools.harnessutil import CliError, run_cowfs

CLK_TCK = os.sysconf("SC_CLK_TCK")


def init_store(path: Path, segment_size: str = "256M", device: str = DEFAULT_DEVICE) -> Path:
    run_cowfs("init", str(path), "--segment-size", segment_size, "--device", device, timeout=600)
    return path


def cpu_seconds(pid: int) -> float:
    """utime + stime of every thread of `pid` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # fields 14 and 15 of stat(5)


def thread_times(pid: int) -> dict[int, tuple[str, float, float]]:
    """{tid: (name as the kernel has it, user s, system s)} of every live thread of `pid`."""
    out: dict[int, tuple[str, float, float]] = {}
    for entry in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{entry}/stat") as f:
                stat = f.read()
        except OSError:  # the thread exited
            continue
        name_part, rest = stat.rsplit(")", 1)
        fields = rest.split()
        out[int(entry)] = (name_part.split("(", 1)[1], int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK)
    return out


def thread_cpu_seconds(pid: int) -> dict[int, tuple[str, float]]:
    """{tid: (name, utime + stime)} of every live thread of `pid`; the main thread is named
    "main", and digits are dropped from names ("Trio thread 12" -> "Trio thread"), so that a
    pool's threads add up under one name. A thread that exits between two calls is missing
    from the second (its CPU only shows in cpu_seconds)."""
    return {tid: ("main" if tid == pid else "".join(c for c in name if not c.isdigit()).strip(), user + system)
            for tid, (name, user, system) in thread_times(pid).items()}


def thread_cpu_delta(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]],
                     total_s: float) -> dict[str, float]:
    """CPU seconds per thread name between two thread_cpu_seconds samples; "exited" is what
    the process used beyond the threads alive at the end (threads that ran and ended between)."""
    per: dict[str, float] = {}
    for tid, (name, cpu) in after.items():
        per[name] = per.get(name, 0.0) + cpu - before.get(tid, (name, 0.0))[1]
    per["exited"] = max(0.0, total_s - sum(per.values()))
    return {k: round(v, 3) for k, v in sorted(per.items(), key=lambda kv: -kv[1])}


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


def mount_store(store: Path, mnt: Path, *options: str) -> int:
    """`cowfs mount STORE MNT OPTIONS...` as a user runs it; the daemon's pid."""
    mnt.mkdir(parents=True, exist_ok=True)
    run_cowfs("mount", str(store), str(mnt), *options, timeout=600)
    pid = daemon_pid(store)
    if pid is None:  # mounted, but no daemon named in the lock file: detach and give up
        lazy_unmount(mnt)
        raise RuntimeError(f"{store} was mounted on {mnt}, but its lock file names no daemon")
    return pid


@contextlib.contextmanager
def mounted(store: Path, mnt: Path, writeback: bool | None = False, compact_idle: str = "off") -> Iterator[Mount]:
    """Mount for the body of the with-block; unmount and reap the daemon however it ends.
    `writeback`: the kernel's writeback cache on, off, or None for cowfs mount's default."""
    wb = [] if writeback is None else ["--writeback-cache" if writeback else "--no-writeback-cache"]
    m = Mount(store, mnt, mount_store(store, mnt, "--compact-idle", compact_idle, *wb))
    try:
        yield m
    finally:
        m.close_client()
        unmount(mnt, m.pid)


def unmount(mnt: Path, pid: int) -> None:
    if str(mnt) in mounted_cowfs():
        try:
            run_cowfs("umount", str(mnt), timeout=300)
        except CliError as e:
            print(f"bench: {e}; lazy unmount", file=sys.stderr)
            lazy_unmount(mnt)
    deadline = time.monotonic() + 60
    while process_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if process_alive(pid):  # our own daemon (pid from the store we mounted), stuck
        os.kill(pid, signal.SIGKILL)
        lazy_unmount(mnt)
