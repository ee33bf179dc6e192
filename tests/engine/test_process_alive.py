"""cowfs.mountinfo.process_alive, which `cowfs umount` and the harnesses wait on: a process
counts as exited only once every one of its threads has, since a process whose main thread
has ended shows as a zombie while its other threads still run and hold its descriptors (a
store's catalog and its locks: opening the store then could fail)."""
from __future__ import annotations

import subprocess
import sys
import time

from cowfs.mountinfo import process_alive

MAIN_THREAD_ENDS = """
import ctypes, threading, time
threading.Thread(target=time.sleep, args=(120,)).start()
print("ready", flush=True)
ctypes.CDLL(None).pthread_exit(None)  # the main thread ends; the process lives on in the other
"""


def _leader_state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(") ", 1)[1][0]


def test_a_process_whose_main_thread_ended_is_alive_while_another_runs() -> None:
    p = subprocess.Popen([sys.executable, "-c", MAIN_THREAD_ENDS], stdout=subprocess.PIPE)
    try:
        assert p.stdout is not None and p.stdout.readline() == b"ready\n"
        deadline = time.monotonic() + 30
        while _leader_state(p.pid) != "Z" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _leader_state(p.pid) == "Z"  # what the old check read as exited
        assert process_alive(p.pid)
    finally:
        p.kill()
        p.wait()
    assert not process_alive(p.pid)


def test_a_zombie_and_a_missing_process_are_not_alive() -> None:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 30
    while _leader_state(p.pid) != "Z" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not process_alive(p.pid)  # exited, not reaped yet
    p.wait()
    assert not process_alive(p.pid)
