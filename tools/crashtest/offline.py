"""The checks while the store is unmounted after a kill: `cowfs fsck`, the history of every
file closed in the cycle (read by the `_inspect` child with the Store API), expiry, now and
then `cowfs gc`; then judging what the history lacks and loading closed versions no other
check loads."""
from __future__ import annotations

import json
import random
import shutil
import subprocess
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cowfs.units import human_bytes
from tools.harnessutil import run_cowfs

from .checks import CheckpointLoader
from .cycle import Cycle
from .oracle import AllowedStates, ends_at
from .report import Totals
from .snapshots import SnapshotBook
from .states import DIR, EMPTY
from .subcommands import INSPECT, REPO_ROOT, child_argv


@dataclass
class OfflineResult:
    notes: list[str]  # for the cycle's line
    found: dict[str, list[str]]  # path -> the contents its history holds
    dumped: dict[str, tuple[str, Path]]  # sha -> (path it was closed at, file with its bytes)
    verified: int  # bytes read from history


class OfflineCheck:
    """Unmounted checks of the harness's store, and the judgement of their findings."""

    def __init__(self, store: Path, logs: Path, oracle: AllowedStates, snapshots: SnapshotBook,
                 loader: CheckpointLoader, totals: Totals, gc_prob: float) -> None:
        self.store = store
        self.logs = logs
        self.oracle = oracle
        self.snapshots = snapshots
        self.loader = loader
        self.totals = totals
        self.gc_prob = gc_prob

    def run(self, cyc: Cycle, closed: dict[str, list[str]], rng: random.Random,
            problems: list[str]) -> OfflineResult:
        notes = [self.fsck(problems)]
        dumped = self.versions_to_load(cyc, closed)
        found, verified = self.check_history(cyc, closed, dumped, rng.random() < 0.75, problems)
        if rng.random() < self.gc_prob:
            r = run_cowfs("gc", str(self.store), "--json", check=False)
            if r.returncode != 0:
                problems.append(f"cowfs gc exited {r.returncode}: {r.stderr.strip()}")
            else:
                freed = json.loads(r.stdout)["bytes_freed"]
                self.totals.gc_runs += 1
                self.totals.gc_freed += freed
                notes.append(f"gc {human_bytes(freed)} freed")
        return OfflineResult(notes, found, dumped, verified)

    def fsck(self, problems: list[str]) -> str:
        t = time.monotonic()
        r = run_cowfs("fsck", str(self.store), check=False)
        note = f"fsck {'clean' if r.returncode == 0 else 'FAILED'} {time.monotonic() - t:.1f}s"
        if r.returncode != 0:
            out = (r.stdout.strip() + "\n" + r.stderr.strip()).strip().splitlines()
            problems.append(f"cowfs fsck exited {r.returncode}:\n" + "\n".join(out[:15])
                            + (f"\n... {len(out) - 15} more lines" if len(out) > 15 else ""))
        return note

    def versions_to_load(self, cyc: Cycle, closed: dict[str, list[str]]) -> dict[str, tuple[str, Path]]:
        """Closed versions no later check loads (not live, not in a snapshot of this cycle): the
        history check writes their bytes to files, to be loaded from there."""
        later = {next(iter(states)) for states in self.oracle.allowed.values() if len(states) == 1}
        later |= self.snapshots.states_to_validate()
        dump_dir = self.logs / f"loads-{cyc.index:03d}"
        dumped: dict[str, tuple[str, Path]] = {}
        for path, shas in closed.items():
            for sha in shas:
                if sha not in self.loader.loaded and sha not in later and sha != EMPTY:
                    dumped[sha] = (path, dump_dir / sha)
        if dumped:
            dump_dir.mkdir(exist_ok=True)
        return dumped

    def check_history(self, cyc: Cycle, closed: dict[str, list[str]], dumped: dict[str, tuple[str, Path]],
                      expire: bool, problems: list[str]) -> tuple[dict[str, list[str]], int]:
        """Run the `_inspect` child; (path -> contents found in its history, bytes read)."""
        # contents first written and closed once in this cycle: their versions must be born in close order
        once = Counter((r["path"], r["sha"]) for r in cyc.records if r["ev"] == "closed")
        order = {p: [x for x in shas if once[p, x] == 1 and self.oracle.first_t[x] > cyc.t_go]
                 for p, shas in closed.items()}
        spec = {"store": str(self.store), "expire": expire, "closed": closed, "order": order,
                "ever": {p: sorted(x for x in self.oracle.ever.get(p, ()) if x not in (None, DIR)) for p in closed},
                "dump": {sha: str(f) for sha, (_, f) in dumped.items()}}
        spec_path = self.logs / f"inspect-{cyc.index:03d}.json"
        spec_path.write_text(json.dumps(spec))
        r = subprocess.run(child_argv(INSPECT, str(spec_path)), capture_output=True, text=True, timeout=300,
                           stdin=subprocess.DEVNULL, cwd=REPO_ROOT)
        if r.returncode != 0:
            problems.append(f"history check failed ({r.returncode}): {r.stderr.strip()[-2000:]}")
            return {p: list(v) for p, v in closed.items()}, 0  # reported already: judge nothing twice
        res: dict[str, Any] = json.loads(r.stdout)
        problems.extend(res["problems"])
        self.totals.history_versions += res["versions"]
        self.totals.expired += res["expired"] or 0
        return res["found"], res["bytes"]

    def judge_history(self, cyc: Cycle, found: dict[str, list[str]], problems: list[str]) -> int:
        """Every version closed this cycle must be in its path's history, unless an in-mount prune
        may have expired it: it was replaced (or its name removed) before that prune ended, and no
        snapshot that exists now holds it. Returns how many were excused so."""
        held = self.snapshots.holders()
        prunes = [q for q in cyc.gc_requests if q.op == "prune"]  # one that failed otherwise is reported already
        excused = 0
        for i, r in enumerate(cyc.records):
            if r["ev"] != "closed" or r["sha"] in found.get(r["path"], ()):
                continue
            path, sha = r["path"], r["sha"]
            lost = (f"history of {path}: closed version {self.oracle.describe(sha)} is not readable from it "
                    f"(close() had returned")
            if (path, sha) in held:
                problems.append(f"{lost}; snapshot {held[(path, sha)]} holds it)")
                continue
            t_end = next((x["t"] for x in cyc.records[i + 1:] if ends_at(x, path)), None)
            if t_end is not None and any(t_end < (q.t_done if q.t_done is not None else cyc.t_kill) for q in prunes):
                excused += 1
            else:
                problems.append(f"{lost}; " + ("it was never replaced" if t_end is None else
                                               "no in-mount prune ran after it was replaced") + ")")
        self.totals.expired_by_prune += excused
        return excused

    def load_dumped(self, dumped: dict[str, tuple[str, Path]], problems: list[str]) -> None:
        """Load the closed versions no other check loaded, from the bytes the history check wrote."""
        for sha, (path, f) in dumped.items():
            if sha in self.loader.loaded or not f.exists():  # loaded meanwhile, or missing (judged above)
                continue
            try:
                self.loader.load(path, f, sha)
                self.totals.loaded_from_history += 1
            except Exception as e:  # noqa: BLE001 - reported
                problems.append(f"history of {path}: closed version {sha[:12]} does not load: {e!r}")
        if dumped:
            shutil.rmtree(next(iter(dumped.values()))[1].parent, ignore_errors=True)
