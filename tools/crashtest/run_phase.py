"""The run phase of one cycle: the writer saves, the snapshot thread and (in some cycles) the
gc thread work the mount, and at the chosen kill point the daemon gets SIGKILL; then the
writer is killed and the mount lazily unmounted."""
from __future__ import annotations

import random
import threading
import time

from .cycle import Cycle
from .errors import HarnessError
from .gc_thread import send_gc_requests
from .snapshots import SnapshotBook


def run_until_kill(cyc: Cycle, snapshots: SnapshotBook, max_run: float, step0: int, rng: random.Random) -> None:
    """Start the writer on step0 and the cycle's threads; once the daemon is killed, kill the
    writer, wait for the threads and the daemon's end, and lazily unmount."""
    w = cyc.writer
    if cyc.kill_point.kind == "event":
        w.add_listener(cyc.on_writer_record)
    threads = [threading.Thread(target=snapshots.take_during, args=(cyc, random.Random(rng.randrange(1 << 31))),
                                name="snapshots", daemon=True)]
    if cyc.mount_gc:
        threads.append(threading.Thread(target=send_gc_requests,
                                        args=(cyc, cyc.mount.store, max_run, random.Random(rng.randrange(1 << 31))),
                                        name="gc", daemon=True))
    w.go(step0)
    cyc.t_go = time.monotonic()
    for t in threads:
        t.start()
    wait_for_kill(cyc, max_run)
    # the daemon is killed (in fire): kill the writer, wait for our threads, lazy unmount
    w.kill()
    cyc.stop.set()
    for t in threads:
        t.join(30)
        if t.is_alive():
            raise HarnessError(f"the {t.name} thread is stuck after the daemon was killed")
    cyc.mount.wait_daemon_gone()
    cyc.mount.lazy_unmount()


def wait_for_kill(cyc: Cycle, max_run: float) -> None:
    """Until the kill fired: fire at once if the writer exited or an error was seen, or at the
    deadline (the time kill point, or max_run + 3 s when the chosen event never came)."""
    w, kp = cyc.writer, cyc.kill_point
    deadline = cyc.t_go + (kp.delay if kp.kind == "time" else max_run + 3)
    while not cyc.fired.wait(0.01):
        if w.proc.poll() is not None:
            cyc.early_exit = w.proc.returncode
            cyc.fire("writer exited")
        elif cyc.errors:
            cyc.fire("error")
        elif time.monotonic() >= deadline:
            cyc.fire(f"time {kp.delay:.2f}s" if kp.kind == "time" else f"time (no {kp.describe()})")
