"""What the consumer mount tests share: a consumer's read-only mount of a bucket in a context
that always unmounts, waiting on conditions with a generous deadline, and a `cowfs watch`
on the consumer whose events are read on a thread."""
from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from cowfs.mountinfo import mounted_cowfs
from tests.support.mountutil import cowfs, force_unmount

DEADLINE = 120.0  # seconds to wait for a condition (the machine may be busy)


def wait_for(what: str, cond: Callable[[], Any]) -> None:
    deadline = time.monotonic() + DEADLINE
    while not cond():
        assert time.monotonic() < deadline, f"{what}: not within {DEADLINE} s"
        time.sleep(0.05)


def has_bytes(path: Path, expect: bytes) -> bool:
    try:
        return path.read_bytes() == expect
    except OSError:
        return False


def drain(seen: "queue.Queue[dict]", until: Callable[[dict], bool]) -> list[dict]:
    """Events up to and including the first that `until` accepts."""
    out: list[dict] = []
    deadline = time.monotonic() + DEADLINE
    while not out or not until(out[-1]):
        out.append(seen.get(timeout=max(deadline - time.monotonic(), 0.01)))
    return out


def subscribed(prod: Path, seen: "queue.Queue[dict]") -> None:
    """Write probe files on the producer until the consumer's watch reports one."""
    for i in range(200):
        (prod / "run" / f".probe-{i}").write_bytes(b"p")
        try:
            drain_deadline = time.monotonic() + 1.0
            while time.monotonic() < drain_deadline:
                e = seen.get(timeout=max(drain_deadline - time.monotonic(), 0.01))
                if e.get("path", "").startswith("/run/.probe-"):
                    return
        except queue.Empty:
            pass
    raise AssertionError("the consumer's watch never reported a probe file")


class Watch:
    """`cowfs watch MNT --json` in a context that always ends it; `events` gets each line.
    Entered once the watch says it is established: no change after that is missed."""

    def __init__(self, mnt: Path) -> None:
        self.mnt = mnt
        self.events: queue.Queue[dict] = queue.Queue()

    def __enter__(self) -> "queue.Queue[dict]":
        self.proc = subprocess.Popen([sys.executable, "-m", "cowfs.cli", "watch", str(self.mnt), "--json"],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        out, err = self.proc.stdout, self.proc.stderr
        assert out is not None and err is not None
        threading.Thread(target=lambda: [self.events.put(json.loads(x)) for x in out], daemon=True).start()
        try:
            line = err.readline()  # "cowfs: watching MNT (Ctrl-C ends)", or an error and EOF
            assert line.startswith("cowfs: watching "), f"cowfs watch {self.mnt}: {line + err.read()}"
        except BaseException:
            self.__exit__()
            raise
        threading.Thread(target=err.read, daemon=True).start()  # drained, so the watch never blocks on it
        return self.events

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


class Consumer:
    """`cowfs mount s3://... --read-only --cache DIR` in a context that always unmounts."""

    def __init__(self, url: str, endpoint: str, mnt: Path, cache: Path, *extra: str) -> None:
        self.args = ("mount", url, str(mnt), "--read-only", "--cache", str(cache), "--endpoint", endpoint, *extra)
        self.mnt, self.cache = mnt, cache

    def __enter__(self) -> Path:
        self.mnt.mkdir(exist_ok=True)
        cowfs(*self.args)
        return self.mnt

    def __exit__(self, *exc: object) -> None:
        if str(self.mnt) in mounted_cowfs():
            if cowfs("umount", str(self.mnt), check=False).returncode != 0:
                force_unmount(self.mnt)
