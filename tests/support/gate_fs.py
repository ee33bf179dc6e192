"""A pyfuse3 file system that holds its request loop at a gate, for
tests/mount/test_session_loop.py.

    python -m tests.support.gate_fs MOUNTPOINT

The root holds directories d0..d16. A client process (this module run with --client) looks
up `gate` in d0: the handler holds the trio thread. Once it does, the client looks up `x`
in d1..d16 from 16 threads (one per directory: the kernel serialises the lookups of one
directory), and those requests queue in the kernel; /proc/<tid>/wchan shows each client
thread waiting for its answer. Then the gate opens, and a task that counts its turns starts.
The script prints as JSON how many requests were queued behind the gate, how often the
session loop waited for the FUSE fd to become readable while it served them (pyfuse3's
`trio.lowlevel.wait_readable`, counted), and how many turns the other task had between the
first and the last of them (none if the loop never let it run while requests were queued).

The client is a process of its own: a thread waiting in the kernel for an answer from its
own process's FUSE connection cannot be killed, so a server killed midway would hang.
Unmounts however it ends; exit status 3 with one line on stderr if the requests never
queued.
"""
from __future__ import annotations

import errno
import json
import os
import stat
import subprocess
import sys
import threading
import time

import pyfuse3
import trio

QUEUED = 16  # requests behind the gate
DIRS = QUEUED + 1
TIMEOUT = 30.0
WAITING = "request_wait_answer"  # the kernel function a thread sleeps in until the daemon answers

waits: list[int] = []
_wait_readable = trio.lowlevel.wait_readable


async def counting_wait_readable(fd: int) -> None:
    waits.append(fd)
    await _wait_readable(fd)


gate_reached = threading.Event()
gate = threading.Event()
turns = 0  # of the task that runs beside the loop once the gate opens
turns_seen: list[int] = []  # `turns` when each queued LOOKUP was served
all_served = False


async def count_turns() -> None:
    global turns
    while not all_served:
        turns += 1
        await trio.lowlevel.checkpoint()


class GateFs(pyfuse3.Operations):
    def _entry(self, inode: int) -> pyfuse3.EntryAttributes:
        e = pyfuse3.EntryAttributes()
        e.st_ino, e.st_mode, e.st_nlink = inode, stat.S_IFDIR | 0o755, 2
        e.entry_timeout = e.attr_timeout = 600
        return e

    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext | None = None) -> pyfuse3.EntryAttributes:
        return self._entry(inode)

    async def lookup(self, parent_inode: int, name: bytes,
                     ctx: pyfuse3.RequestContext | None = None) -> pyfuse3.EntryAttributes:
        if parent_inode == pyfuse3.ROOT_INODE and name.startswith(b"d") and name[1:].isdigit():
            return self._entry(pyfuse3.ROOT_INODE + 1 + int(name[1:]))
        global all_served
        if name == b"gate":
            gate_reached.set()
            gate.wait(TIMEOUT)  # holds the trio thread: requests sent meanwhile queue in the kernel
            trio.lowlevel.spawn_system_task(count_turns)
        else:
            turns_seen.append(turns)
            all_served = len(turns_seen) == QUEUED
        raise pyfuse3.FUSEError(errno.ENOENT)


def client(mountpoint: str) -> int:
    """Look up d0/gate; after a line on stdin, d1/x..d8/x, each from its own thread."""
    def lookup(path: str) -> None:
        try:
            os.stat(os.path.join(mountpoint, path))
        except FileNotFoundError:
            pass

    for i in range(DIRS):
        os.stat(os.path.join(mountpoint, f"d{i}"))  # cached from here on
    threads = [threading.Thread(target=lookup, args=("d0/gate",))]
    threads[0].start()
    sys.stdin.readline()
    threads += [threading.Thread(target=lookup, args=(f"d{i}/x",)) for i in range(1, DIRS)]
    for t in threads[1:]:
        t.start()
    for t in threads:
        t.join()
    return 0


def threads_waiting(pid: int) -> int:
    n = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/wchan") as f:
                n += f.read() == WAITING
        except OSError:
            continue
    return n


def serve(mountpoint: str) -> int:
    trio.lowlevel.wait_readable = counting_wait_readable  # pyfuse3 looks it up at every wait
    pyfuse3.init(GateFs(), mountpoint, ["fsname=cowfs-test-gate"])
    loop = threading.Thread(target=trio.run, args=(pyfuse3.main,))
    loop.start()
    lookups = None
    try:
        lookups = subprocess.Popen([sys.executable, "-m", "tests.support.gate_fs", "--client", mountpoint],
                                   stdin=subprocess.PIPE, text=True)
        if not gate_reached.wait(TIMEOUT):
            print("gate_fs: the gate's LOOKUP never reached the daemon", file=sys.stderr)
            return 3
        lookups.stdin.write("go\n")  # type: ignore[union-attr]
        lookups.stdin.flush()  # type: ignore[union-attr]
        deadline = time.monotonic() + TIMEOUT
        while threads_waiting(lookups.pid) < DIRS:  # polled: the kernel offers nothing to wait on
            if time.monotonic() > deadline:
                print("gate_fs: the LOOKUPs behind the gate never queued", file=sys.stderr)
                return 3
            time.sleep(0.001)
        before = len(waits)
        gate.set()
        if lookups.wait(TIMEOUT) != 0:
            print("gate_fs: the client failed", file=sys.stderr)
            return 3
        print(json.dumps({"queued": QUEUED, "waits": len(waits) - before,
                          "turns_between": turns_seen[-1] - turns_seen[0]}))
        return 0
    finally:
        gate.set()
        trio.from_thread.run_sync(pyfuse3.terminate, trio_token=pyfuse3.trio_token)
        loop.join()
        pyfuse3.close(unmount=True)
        if lookups is not None and lookups.poll() is None:
            lookups.kill()  # its requests fail now that the connection is gone
            lookups.wait()


if __name__ == "__main__":
    if sys.argv[1] == "--client":
        sys.exit(client(sys.argv[2]))
    sys.exit(serve(sys.argv[1]))
