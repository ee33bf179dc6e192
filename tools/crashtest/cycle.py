"""One cycle: its kill point, and what the threads that drive its run phase (run_phase.py)
note in it, up to the kill (Cycle.fire) that sends the daemon SIGKILL."""
from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass

from .gc_requests import GcRequest
from .mounting import HarnessMount
from .oracle import WriterRename
from .states import PathState
from .writer_process import WriterProcess

STALL = 5.0  # seconds without a writer record while the daemon lives: a hang (a step takes < 0.5 s)


@dataclass
class KillPoint:
    """What the kill fires on: `kind` time | event | snapshot | gc | gc-punch."""
    kind: str
    event: str | None
    nth: int
    delay: float

    def describe(self) -> str:
        return self.kind if self.kind != "event" else f"{self.event}#{self.nth}"


KILL_POINTS: list[tuple[int, str, str | None, int, float]] = [  # (weight, kind, event, max nth, max delay in s)
    (26, "time", None, 0, 0.0),
    (13, "event", "begin", 10, 0.080),      # mid-write (data still in the kernel's cache or in the daemon)
    (13, "event", "closing", 6, 0.020),     # close() under way: inside the commit
    (5, "event", "closed", 6, 0.002),       # right after a close returned
    (10, "event", "rename_begin", 3, 0.003),
    (11, "snapshot", None, 2, 0.006),       # during a snapshot mkdir
    (8, "event", "rmtree_begin", 2, 0.006),  # checkpoint rotation
    (6, "event", "mkdir_begin", 3, 0.003),
    (8, "gc", None, 2, 0.060),              # after an in-mount gc/prune request was sent: expiry, gc's decision
    (6, "gc-punch", None, 1, 0.004),        # after its first progress line: gc punches and deletes segments
]


def pick_kill_point(rng: random.Random, max_run: float) -> KillPoint:
    _, kind, event, max_nth, max_delay = rng.choices(KILL_POINTS, [k[0] for k in KILL_POINTS])[0]
    nth = rng.randint(1, max_nth) if max_nth else 0
    delay = rng.uniform(0.05, max_run) if kind == "time" else rng.uniform(0, max_delay)
    return KillPoint(kind, event, nth, delay)


class Cycle:
    """One cycle's run: filled in by the threads that drive it, read by the checks."""

    def __init__(self, index: int, seed: int, writer: WriterProcess, kill_point: KillPoint,
                 mount: HarnessMount, mount_gc: bool) -> None:
        self.index = index
        self.seed = seed
        self.writer = writer
        self.kill_point = kill_point
        self.mount = mount
        self.mount_gc = mount_gc  # in-mount gc/prune requests in this cycle
        self.fired = threading.Event()
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.t_go = self.t_kill = 0.0
        self.reason = ""
        self.early_exit: int | None = None
        self.writer_at_kill: dict | None = None
        self.events_seen = 0  # writer records of the kill point's event so far
        self.snap = "idle"  # what the snapshot thread is doing
        self.snap_at_kill = "idle"
        self.gc_at_kill: GcRequest | None = None
        self.errors: list[str] = []  # seen while the daemon was alive
        self.snap_windows: dict[str, list[float]] = {}  # name -> [mkdir started, mkdir returned (inf: not)]
        self.gc_requests: list[GcRequest] = []
        self.records: list[dict] = []  # the writer's durable log
        self.snap_states: dict[str, dict[str, set[PathState]]] = {}  # name -> what the log allows during its mkdir
        self.renames: list[WriterRename] = []

    def killed_in_gc(self) -> GcRequest | None:
        q = self.gc_at_kill
        return q if q is not None and q.result is None else None

    def fire(self, reason: str) -> None:
        """kill -9 the daemon (once per cycle) and note what was going on."""
        with self.lock:
            if self.fired.is_set():
                return
            self.t_kill = time.monotonic()
            self.reason = reason
            self.writer_at_kill = self.writer.last_record()
            self.snap_at_kill = self.snap
            self.gc_at_kill = next((q for q in self.gc_requests if q.t_done is None and q.error is None), None)
            if self.gc_at_kill is not None:
                self.gc_at_kill.killed_in = self.gc_at_kill.phase()
            if not self.mount.daemon_alive():
                self.errors.append(f"the daemon (pid {self.mount.daemon_pid}) was already dead when the kill "
                                   f"fired ({reason})")
            elif (idle := self.t_kill - max(self.writer.last_receipt(), self.t_go)) > STALL:
                self.errors.append(f"the writer made no progress in the {idle:.1f}s before the kill ({reason}): "
                                   f"hung in a request to the daemon?")
            self.fired.set()
            self.mount.kill_daemon()

    def fire_later(self, reason: str) -> None:
        """Fire after the kill point's delay."""
        delay = self.kill_point.delay
        t = threading.Timer(delay, self.fire, (f"{reason}+{delay * 1e3:.1f}ms",))
        t.daemon = True
        t.start()

    def on_writer_record(self, r: dict) -> None:
        """Fire (after the delay) on the kill point's nth writer event."""
        kp = self.kill_point
        if r["ev"] == kp.event:
            self.events_seen += 1
            if self.events_seen == kp.nth:
                if kp.delay:
                    time.sleep(kp.delay)
                self.fire(f"{kp.event}#{kp.nth}+{kp.delay * 1e3:.1f}ms")
