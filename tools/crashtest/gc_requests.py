"""The in-mount gc, prune and compact requests of a cycle, as the harness saw them: sent by
the gc thread (gc_thread.py), noted by the kill (cycle.py), judged by the checks."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cowfs.units import human_bytes


@dataclass
class GcRequest:
    """One in-mount gc or prune request, as the harness saw it (times: CLOCK_MONOTONIC)."""
    n: int
    op: str  # "gc", "prune" or "compact"
    t_sent: float
    progress: tuple[int, int] | None = None  # the last progress line
    t_done: float | None = None  # its answer arrived
    result: dict[str, Any] | None = None
    error: str | None = None
    killed_in: str | None = None  # its phase when the kill fired, if it was under way

    def phase(self) -> str:
        if self.op == "compact":
            return "compacting"
        if self.progress is None:
            return "expiring/deciding" if self.op == "prune" else "deciding"
        return "punching" if self.progress[0] < self.progress[1] else "deleting segments"

    def freed(self) -> int:
        if self.op == "compact":
            return 0
        g = (self.result or {}).get("gc") if self.op == "prune" else self.result
        return g["bytes_freed"] if g else 0

    def note(self) -> str:
        if self.result is None:
            return f"{self.op} killed {self.killed_in}" if self.killed_in else f"{self.op} failed"
        if self.op == "compact":
            return f"compact {self.result['recut']} files, {self.result['deltas']} deltas"
        rows = f", {self.result['history_rows_dropped']} rows dropped" if self.op == "prune" else ""
        return f"{self.op} {human_bytes(self.freed())} freed{rows}"
