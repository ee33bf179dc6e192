"""The one mount the harness makes (STORE on MNT) and its daemon: mount, kill -9, lazy
unmount, the daemon's log, and the clean-up on exit. The daemon is, with the writers, the
only process the harness kills, by pid, after checking it is still its own."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

from cowfs.mountinfo import daemon_pid, lazy_unmount, mount_fields, process_alive
from tools.harnessutil import run_cowfs

from .errors import HarnessError


def proc_args(pid: int) -> list[str]:
    """The command line of process `pid` ([] once it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().decode(errors="replace").split("\0")
    except OSError:
        return []


class HarnessMount:
    """STORE mounted on MNT by `cowfs mount`, and the daemon that serves it."""

    def __init__(self, store: Path, mnt: Path) -> None:
        self.store = store
        self.mnt = mnt
        self.daemon_pid: int | None = None
        self.log_pos = 0  # where this mount's lines start in STORE/cowfs.log

    def is_mounted(self) -> bool:
        return mount_fields(self.mnt) is not None

    def mount(self) -> None:
        log = self.store / "cowfs.log"
        self.log_pos = log.stat().st_size if log.exists() else 0
        r = run_cowfs("mount", str(self.store), str(self.mnt), check=False, timeout=120)
        if r.returncode != 0:
            raise HarnessError(f"cowfs mount failed ({r.returncode}): {r.stderr.strip()}")
        m = re.search(r"daemon pid (\d+)", r.stdout)
        lock_pid = daemon_pid(self.store)
        if not m or lock_pid is None or lock_pid != int(m.group(1)):
            raise HarnessError(f"daemon pid unclear: mount said {r.stdout.strip()!r}, STORE/lock holds {lock_pid!r}")
        self.daemon_pid = lock_pid
        if not self.ours(self.daemon_pid):
            raise HarnessError(f"pid {self.daemon_pid} is not the daemon of {self.store} on {self.mnt}: "
                               f"{proc_args(self.daemon_pid)}")

    def umount(self) -> subprocess.CompletedProcess:
        """A clean `cowfs umount MNT`; the daemon is gone once it succeeded."""
        r = run_cowfs("umount", str(self.mnt), check=False, timeout=120)
        if r.returncode == 0:
            self.daemon_pid = None
        return r

    def ours(self, pid: int) -> bool:
        """Is pid (still) the daemon this harness mounted? (guards against pid reuse)"""
        args = proc_args(pid)
        return str(self.store) in args and str(self.mnt) in args

    def daemon_alive(self) -> bool:
        return self.daemon_pid is not None and process_alive(self.daemon_pid) and self.ours(self.daemon_pid)

    def kill_daemon(self) -> None:
        if self.daemon_alive():
            os.kill(self.daemon_pid, signal.SIGKILL)  # type: ignore[arg-type]

    def wait_daemon_gone(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while self.daemon_pid is not None and process_alive(self.daemon_pid):  # not ours(): an exiting
            # process has no cmdline any more but may still hold the store's lock and /dev/fuse
            if time.monotonic() > deadline:
                raise HarnessError(f"daemon pid {self.daemon_pid} still alive {timeout:.0f} s after SIGKILL")
            time.sleep(0.01)
        self.daemon_pid = None

    def lazy_unmount(self) -> None:
        """fusermount3 -u -z of MNT, whose daemon is dead."""
        if self.is_mounted():
            lazy_unmount(self.mnt)
        if self.is_mounted():
            raise HarnessError(f"{self.mnt} still mounted after fusermount3 -u -z")

    def daemon_log_problems(self) -> list[str]:
        """Warnings and errors the daemon logged since this mount (it logs none in a sound run)."""
        try:
            with open(self.store / "cowfs.log", "rb") as f:
                f.seek(self.log_pos)
                text = f.read().decode(errors="replace")
        except OSError:
            return []
        bad = [line for line in text.splitlines()
               if re.match(r"\S+ \S+ \d+ (WARNING|ERROR|CRITICAL) ", line) or line.startswith("Traceback")]
        more = [f"daemon log: ... {len(bad) - 10} more"] if len(bad) > 10 else []
        return [f"daemon log: {line}" for line in bad[:10]] + more

    def stop(self) -> None:
        """On exit, also after an error or Ctrl-C: a clean umount if the daemon lives, else
        (or if that fails) kill -9 it; in the end MNT is unmounted."""
        if self.daemon_pid is None and self.is_mounted():
            # interrupted inside `cowfs mount`: the daemon of our store on our mountpoint is ours
            pid = daemon_pid(self.store)
            self.daemon_pid = pid if pid is not None and self.ours(pid) else None
        if self.daemon_alive() and self.is_mounted():
            try:
                ok = run_cowfs("umount", str(self.mnt), check=False, timeout=120).returncode == 0
            except subprocess.TimeoutExpired:
                ok = False
            if not ok:
                self.kill_daemon()
        if self.daemon_pid is not None:
            try:
                self.wait_daemon_gone(10)
            except HarnessError:
                pass
        if self.is_mounted():
            lazy_unmount(self.mnt)
