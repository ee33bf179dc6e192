"""What the harness prints: one line per cycle, and the totals of the run."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cowfs.units import human_bytes

from .cycle import Cycle

WRITER_PHASES = {  # the writer's last record -> what it was doing
    "ready": "starting", "started": "starting", "begin": "mid-write", "closing": "closing", "closed": "just closed",
    "rename_begin": "mid-rename", "renamed": "just renamed", "mkdir_begin": "mid-mkdir",
    "mkdir_done": "just mkdir'ed", "rmtree_begin": "mid-rotation", "rmtree_done": "just rotated",
    "unlink_begin": "mid-unlink", "unlinked": "just unlinked",
}


def writer_phase(r: dict | None) -> str:
    if r is None:
        return "starting"
    return WRITER_PHASES.get(r["ev"], r["ev"])


@dataclass
class CycleResult:
    """What the checks of one cycle found, for its line."""
    steps: int  # writer steps begun
    n_closed: int  # closes the writer reported
    notes: list[str]  # of the unmounted checks (fsck, gc)
    excused: int  # closed versions an in-mount prune may have expired
    nfiles: int  # live files checked
    nsnaps: int  # snapshots checked
    verified: int  # bytes
    problems: list[str]


def cycle_line(cyc: Cycle, res: CycleResult, cycles: int, elapsed: float) -> str:
    wr = cyc.writer_at_kill
    where = writer_phase(wr)
    if where != "starting":
        where += " " + str((wr or {}).get("path") or (wr or {}).get("src") or "")
    q = cyc.killed_in_gc()
    if q is not None:
        where += f", {q.op} {q.killed_in}"
    gc_notes = ", ".join(f"{q.note()}" for q in cyc.gc_requests)
    return (f"cycle {cyc.index + 1:>3}/{cycles} seed {cyc.seed}: kill {cyc.t_kill - cyc.t_go:.2f}s in [{cyc.reason}] "
            f"writer {where}, snapshots {cyc.snap_at_kill} | {res.steps} steps, {res.n_closed} closes"
            + (f" | mount gc: {gc_notes or 'none sent'}"
               + (f", {res.excused} closed versions expired" if res.excused else "") if cyc.mount_gc else "")
            + f" | {', '.join(res.notes)} | {res.nfiles} files + {res.nsnaps} snapshots, "
            f"{human_bytes(res.verified)} verified | {'recovered' if not res.problems else 'FAILED'} ({elapsed:.1f}s)")


def by_count(d: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(d.items(), key=lambda kv: -kv[1])) or "none"


@dataclass
class Totals:
    """Sums over the run's cycles."""
    kills: int = 0
    verified_bytes: int = 0
    live_files: int = 0
    closed: int = 0  # closes reported by the writer
    snapshot_checks: int = 0
    history_versions: int = 0
    writer_at_kill: dict[str, int] = field(default_factory=dict)  # writer phase -> kills
    in_snapshot_mkdir: int = 0
    in_gc: dict[str, int] = field(default_factory=dict)  # gc/prune phase -> kills
    gc_runs: int = 0  # unmounted `cowfs gc`
    gc_freed: int = 0
    expired: int = 0  # history rows expired unmounted
    mount_gc_cycles: int = 0
    mount_gc: dict[str, int] = field(default_factory=lambda: {"gc": 0, "prune": 0, "compact": 0})  # requests sent
    mount_gc_answered: int = 0
    mount_gc_freed: int = 0
    mount_gc_rows: int = 0
    expired_by_prune: int = 0
    loaded_from_history: int = 0

    def count_kill(self, cyc: Cycle, n_closed: int) -> None:
        self.closed += n_closed
        self.kills += 1
        phase = writer_phase(cyc.writer_at_kill)
        self.writer_at_kill[phase] = self.writer_at_kill.get(phase, 0) + 1
        if cyc.snap_at_kill.startswith("mkdir"):
            self.in_snapshot_mkdir += 1
        q = cyc.killed_in_gc()
        if q is not None and q.killed_in is not None:
            self.in_gc[q.killed_in] = self.in_gc.get(q.killed_in, 0) + 1
        self.mount_gc_cycles += cyc.mount_gc
        for q in cyc.gc_requests:
            self.mount_gc[q.op] += 1
            if q.result is not None:
                self.mount_gc_answered += 1
                self.mount_gc_freed += q.freed()
                self.mount_gc_rows += q.result.get("history_rows_dropped", 0)

    def print(self, stats: dict[str, Any]) -> None:
        """The totals lines (`kills: ...` first); `stats`: of `cowfs stats --json`, {} if it failed."""
        print(f"kills: {self.kills} (writer: {by_count(self.writer_at_kill)}; {self.in_snapshot_mkdir} during a "
              f"snapshot mkdir; {sum(self.in_gc.values())} during an in-mount gc/prune: {by_count(self.in_gc)})",
              flush=True)
        print(f"verified: {human_bytes(self.verified_bytes)} ({self.verified_bytes} bytes): {self.live_files} live "
              f"files, {self.snapshot_checks} snapshot checks, {self.history_versions} versions from history "
              f"({self.loaded_from_history} loaded from there), {self.closed} closes reported by the writer", flush=True)
        print(f"in-mount gc: {self.mount_gc_cycles} cycles, {self.mount_gc['prune']} prune + {self.mount_gc['gc']} gc "
              f"+ {self.mount_gc['compact']} compact requests, {self.mount_gc_answered} answered: {human_bytes(self.mount_gc_freed)} freed, "
              f"{self.mount_gc_rows} history rows dropped; {self.expired_by_prune} closed versions expired by them",
              flush=True)
        print(f"unmounted: gc {self.gc_runs} runs, {human_bytes(self.gc_freed)} freed; {self.expired} history rows "
              "expired; store " + (f"{human_bytes(stats.get('physical_bytes', 0))} physical, dedup "
                                   f"{stats.get('dedup_ratio', 0):.2f}" if stats else "?"), flush=True)
