"""The snapshots the harness takes while the writer runs (`mkdir MNT/.snapshots/NAME`), what
it recorded in each right after the mkdir, and the ones a kill left uncertain."""
from __future__ import annotations

import math
import os
import random
import time
from pathlib import Path
from typing import TYPE_CHECKING

from .states import PathState, walk_tree

if TYPE_CHECKING:
    from .cycle import Cycle

SNAP_GLOB = "c[0-9]*-[0-9]*"  # matches every harness snapshot: an in-mount prune keeps them all


class RecordedSnapshot:
    """A snapshot of the harness, and the states it held when first read."""

    def __init__(self, name: str, cycle: int) -> None:
        self.name = name
        self.cycle = cycle
        self.files: dict[str, tuple[str, int]] | None = None  # rel path -> (sha or DIR, size)
        self.validated = False  # checked against the writer's log once


class SnapshotBook:
    """The harness's snapshots, oldest first, and the ones whose mkdir or rmdir the kill interrupted."""

    def __init__(self, mnt: Path, max_snapshots: int) -> None:
        self.dir = mnt / ".snapshots"
        self.max_snapshots = max_snapshots
        self.recorded: dict[str, RecordedSnapshot] = {}  # oldest first
        self.uncertain: dict[str, str] = {}  # name -> "mkdir" | "rmdir": interrupted by the kill

    def take_during(self, cyc: Cycle, rng: random.Random) -> None:
        """The snapshot thread of a cycle: mkdir, record, rmdir the oldest, until the cycle stops."""
        k = 0
        while not cyc.stop.wait(rng.uniform(0.15, 0.9)):
            if cyc.fired.is_set():
                return
            name = f"c{cyc.index:03d}-{k}"
            k += 1
            self.uncertain[name] = "mkdir"
            cyc.snap = f"mkdir {name}"
            if cyc.kill_point.kind == "snapshot" and k == cyc.kill_point.nth:
                cyc.fire_later(f"snapshot#{k}")
            window = cyc.snap_windows[name] = [time.monotonic(), math.inf]
            try:
                os.mkdir(self.dir / name)
                window[1] = time.monotonic()
                cyc.snap = f"reading {name}"
                files = walk_tree(self.dir / name)
            except OSError as e:
                if not cyc.fired.is_set():
                    cyc.errors.append(f"snapshot {name}: {e!r} while the daemon was alive")
                return
            snap = RecordedSnapshot(name, cyc.index)
            snap.files = files
            self.recorded[name] = snap
            del self.uncertain[name]
            if not self.delete_oldest(cyc):
                return
            cyc.snap = "idle"

    def delete_oldest(self, cyc: Cycle) -> bool:
        """rmdir the oldest snapshots beyond max_snapshots. False if an rmdir failed."""
        while len(self.recorded) > self.max_snapshots:
            old = next(iter(self.recorded))
            self.uncertain[old] = "rmdir"
            cyc.snap = f"rmdir {old}"
            try:
                os.rmdir(self.dir / old)
            except OSError as e:
                if not cyc.fired.is_set():
                    cyc.errors.append(f"rmdir snapshot {old}: {e!r} while the daemon was alive")
                return False
            del self.recorded[old]
            del self.uncertain[old]
        return True

    def holders(self) -> dict[tuple[str, PathState], str]:
        """(path, state) -> the name of the oldest recorded snapshot that holds it."""
        held: dict[tuple[str, PathState], str] = {}
        for s in self.recorded.values():
            for p, (st, _) in (s.files or {}).items():
                held.setdefault((p, st), s.name)
        return held

    def states_to_validate(self) -> set[PathState]:
        """Every state held by a snapshot not yet checked against the writer's log."""
        return {st for s in self.recorded.values() if not s.validated for st, _ in (s.files or {}).values()}
