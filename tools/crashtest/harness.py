"""The run: init the store, mount it, then cycle after cycle run the writer to a kill, check
unmounted, remount and check; a clean unmount and a last fsck at the end."""
from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

from cowfs.units import human_bytes
from tools.harnessutil import run_cowfs

from .checks import CheckpointLoader, RemountCheck
from .cycle import Cycle, pick_kill_point
from .errors import HarnessError
from .mounting import HarnessMount
from .offline import OfflineCheck
from .oracle import AllowedStates
from .report import CycleResult, Totals, cycle_line
from .run_phase import run_until_kill
from .snapshots import SnapshotBook
from .states import RUN
from .writer_process import WriterProcess


class Harness:
    """Everything one run of the crash test owns: its directories, its mount, its writers,
    the allowed states, the recorded snapshots and the totals."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.seed: int = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
        self.rng = random.Random(self.seed)
        if args.workdir:
            self.work = Path(args.workdir).absolute()
            self.work.mkdir(parents=True, exist_ok=True)
            self.own_work = False
        else:
            self.work = Path(tempfile.mkdtemp(prefix="cowfs-crash-"))
            self.own_work = True
        self.store = Path(args.store).absolute() if args.store else self.work / "store"
        self.mnt = self.work / "mnt"
        self.logs = self.work / "logs"
        self.logs.mkdir(exist_ok=True)
        self.mnt.mkdir(exist_ok=True)
        self.mount = HarnessMount(self.store, self.mnt)
        self.oracle = AllowedStates()
        self.snapshots = SnapshotBook(self.mnt, args.max_snapshots)
        self.loader = CheckpointLoader()
        self.totals = Totals()
        self.remount_check = RemountCheck(self.mnt, self.oracle, self.snapshots, self.loader)
        self.offline_check = OfflineCheck(self.store, self.logs, self.oracle, self.snapshots, self.loader,
                                          self.totals, args.gc_prob)
        self.writer: WriterProcess | None = None
        self.next_writer: WriterProcess | None = None
        self.next_step = 0

    def cleanup(self) -> None:
        """Stop what we started: the writers, then our daemon (clean umount first)."""
        for w in (self.writer, self.next_writer):
            if w is not None:
                try:
                    w.kill()
                except Exception:  # noqa: BLE001
                    pass
        self.mount.stop()

    def spawn_writer(self, cycle: int) -> WriterProcess:
        return WriterProcess(self.work, self.logs, self.mnt / RUN, cycle, self.rng.randrange(1 << 31),
                             self.args.overwrite_safetensors)

    # -- the run -----------------------------------------------------------------------

    def run(self) -> int:
        a = self.args
        print(f"crashtest: {a.cycles} cycles, seed {self.seed}, store {self.store}, work dir {self.work}", flush=True)
        self.init_store()
        t_start = time.monotonic()
        recovered = 0
        self.mount.mount()
        (self.mnt / RUN).mkdir()
        for cycle in range(a.cycles):
            ok, line, problems = self.run_cycle(cycle)
            print(line, flush=True)
            for p in problems:
                print("    " + p.replace("\n", "\n    "), flush=True)
            if problems:
                print(f"    writer log: {self.logs / f'writer-{cycle:03d}.jsonl'}, daemon log: {self.store / 'cowfs.log'}",
                      flush=True)
            recovered += ok
            if not ok and a.stop_on_failure:
                break
        final = self.finish()
        print(f"{recovered}/{a.cycles} recovered ({self.totals.kills} kills, {human_bytes(self.totals.verified_bytes)} "
              f"verified) in {time.monotonic() - t_start:.1f}s (seed {self.seed})"
              + ("; final unmount/fsck FAILED" if final else ""), flush=True)
        return 0 if recovered == a.cycles and not final else 1

    def init_store(self) -> None:
        if (self.store / "cowfs-store.json").exists():
            raise HarnessError(f"{self.store} is already a store: the harness needs a fresh one (it expires history)")
        if self.store.exists() and any(self.store.iterdir()):
            raise HarnessError(f"{self.store} exists and is not empty (give a new or empty directory)")
        r = run_cowfs("init", str(self.store), "--segment-size", self.args.segment_size, "--device", self.args.device,
                      check=False)
        if r.returncode != 0:
            raise HarnessError(f"cowfs init failed: {r.stderr.strip()}")

    def finish(self) -> list[str]:
        """A clean unmount at the end, and a last fsck; prints what failed, then the totals."""
        final = []
        r = self.mount.umount()
        if r.returncode != 0:
            final.append(f"final cowfs umount failed: {r.stderr.strip()}")
        final += self.mount.daemon_log_problems()
        r = run_cowfs("fsck", str(self.store), check=False)
        if r.returncode != 0:
            final.append(f"final fsck failed:\n{r.stdout}{r.stderr}")
        for line in final:
            print(line, flush=True)
        r = run_cowfs("stats", str(self.store), "--json", check=False)
        self.totals.print(json.loads(r.stdout) if r.returncode == 0 else {})
        return final

    # -- one cycle ---------------------------------------------------------------------

    def run_cycle(self, cycle: int) -> tuple[bool, str, list[str]]:
        t0 = time.monotonic()
        cseed = self.rng.randrange(1 << 31)
        rng = random.Random(cseed)
        w = self.next_writer or self.spawn_writer(cycle)
        self.writer = w
        # the next cycle's writer starts now: torch's import and its warm-up overlap this cycle
        self.next_writer = self.spawn_writer(cycle + 1) if cycle + 1 < self.args.cycles else None
        if not w.ready.wait(120):
            raise HarnessError(f"writer not ready after 120 s: {w.stderr_tail()}")
        kill_point = pick_kill_point(rng, self.args.max_run)
        mount_gc = kill_point.kind.startswith("gc") or rng.random() < self.args.mount_gc_prob
        cyc = Cycle(cycle, cseed, w, kill_point, self.mount, mount_gc)
        run_until_kill(cyc, self.snapshots, self.args.max_run, self.next_step, rng)
        self.writer = None
        problems = list(cyc.errors) + self.mount.daemon_log_problems()
        if cyc.early_exit is not None:
            problems.append(f"the writer exited ({cyc.early_exit}) before the kill:\n{w.stderr_tail()}")
        closed, steps = self.replay_writer_log(cyc)
        n_closed = sum(len(v) for v in closed.values())
        self.totals.count_kill(cyc, n_closed)

        off = self.offline_check.run(cyc, closed, rng, problems)
        self.mount.mount()
        vbytes, nfiles, nsnaps = self.remount_check.run(cyc, problems)
        excused = self.offline_check.judge_history(cyc, off.found, problems)
        self.offline_check.load_dumped(off.dumped, problems)
        verified = off.verified + vbytes
        self.totals.verified_bytes += verified
        self.totals.live_files += nfiles
        self.totals.snapshot_checks += nsnaps
        res = CycleResult(steps, n_closed, off.notes, excused, nfiles, nsnaps, verified, problems)
        return not problems, cycle_line(cyc, res, self.args.cycles, time.monotonic() - t0), problems

    def replay_writer_log(self, cyc: Cycle) -> tuple[dict[str, list[str]], int]:
        """The writer's durable log through the allowed states, noting what each snapshot of this
        cycle may hold. Returns (path -> contents closed there, in order; steps begun)."""
        cyc.records = cyc.writer.file_records()
        windows = {name: (t1, min(t2, cyc.t_kill)) for name, (t1, t2) in cyc.snap_windows.items()}
        cyc.snap_states = self.oracle.replay(cyc.records, windows)
        cyc.renames = list(self.oracle.renames)
        closed: dict[str, list[str]] = {}
        for r in cyc.records:
            if r["ev"] == "closed":
                closed.setdefault(r["path"], []).append(r["sha"])
            if "step" in r:
                self.next_step = max(self.next_step, r["step"] + 1)
        return closed, len({r["step"] for r in cyc.records if "step" in r})
