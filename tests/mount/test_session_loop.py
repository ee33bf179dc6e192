"""pyfuse3's session loop as cowfs's build patches it (native/pyfuse3/cowfs.patch): a request
already queued is taken at once, without a wait for the FUSE fd first (a trio lock and an
epoll round trip, a quarter of the FUSE thread's CPU per small file)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cowfs.mountinfo import daemon_pid
from tests.support.mountutil import mounted

pytestmark = pytest.mark.mount
REPO = Path(__file__).resolve().parents[2]


def unmount_if_mounted(mnt: Path) -> None:
    """After gate_fs, which unmounts itself unless it was killed: a lazy unmount of what is left."""
    with open("/proc/self/mountinfo") as f:
        if any(line.split()[4] == str(mnt) for line in f):
            subprocess.run(["fusermount3", "-u", "-z", str(mnt)], capture_output=True)


def test_requests_queued_behind_a_busy_loop_are_taken_without_waiting_and_other_tasks_still_run(tmp_path: Path) -> None:
    mnt = tmp_path / "gate"
    mnt.mkdir()
    try:
        r = subprocess.run([sys.executable, "-m", "tests.support.gate_fs", str(mnt)], cwd=REPO, capture_output=True,
                           text=True, timeout=120)
    finally:
        unmount_if_mounted(mnt)
    assert r.returncode == 0, r.stderr
    counts = json.loads(r.stdout)
    # the stock loop waits before every request (17 times); this one when the queue is empty,
    # once for each of its two tasks
    assert counts["queued"] == 16 and counts["waits"] <= 2, counts
    # and it lets the other tasks run while requests keep coming (once per 8 requests): a
    # loop that never yields while requests are queued gives them no turn (0)
    assert counts["turns_between"] >= 1, counts


def test_the_daemons_fuse_fd_is_non_blocking(store_path: Path, tmp_path: Path) -> None:
    """The loop can take a queued request without waiting only from a non-blocking fd."""
    with mounted(store_path, tmp_path / "mnt"):
        pid = daemon_pid(store_path)
        assert pid is not None
        fds = [fd for fd in os.listdir(f"/proc/{pid}/fd") if os.readlink(f"/proc/{pid}/fd/{fd}") == "/dev/fuse"]
        assert fds
        for fd in fds:
            flags = next(ln for ln in Path(f"/proc/{pid}/fdinfo/{fd}").read_text().splitlines()
                         if ln.startswith("flags:"))
            assert int(flags.split()[1], 8) & os.O_NONBLOCK
