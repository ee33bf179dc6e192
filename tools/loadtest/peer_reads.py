"""A writer's reads of what it did not write: other writers' committed files, and the
snapshots the controller recorded. Each read is checked against the journal of whoever
wrote it: a version that writer began, or the bytes recorded when the snapshot was taken."""
from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

from tools.harnessutil import sha_file

from .errors import LoadError
from .journal import RecordedSnapshotsView, WriterView, snapshot_journal_path, writer_journal_path
from .path_locks import PathLocks


class PeerReader:
    """Reads for writer `idx`; counts into the writer's `stats`."""

    def __init__(self, idx: int, procs: int, mnt: Path, workdir: Path, rng: random.Random, locks: PathLocks,
                 stats: Counter[str]) -> None:
        self.idx = idx
        self.mnt = mnt
        self.rng = rng
        self.locks = locks
        self.stats = stats
        self.others = {j: WriterView(writer_journal_path(workdir, j)) for j in range(procs) if j != idx}
        self.snaps = RecordedSnapshotsView(snapshot_journal_path(workdir))

    def read_other(self) -> None:
        """A committed file of another writer: one of the versions it began, never torn."""
        j = self.rng.choice(sorted(self.others))
        view = self.others[j].refresh()
        if not view.current:
            return
        rel = self.rng.choice(sorted(view.current))
        gone_before = view.gone[rel]
        path = self.mnt / f"w{j}" / rel
        try:
            with self.locks.hold(j, rel, exclusive=False):
                got, n = sha_file(path)
        except FileNotFoundError:
            if view.refresh().gone[rel] > gone_before:
                self.stats["reads_skipped"] += 1
                return
            raise LoadError(f"w{self.idx} reading w{j}/{rel}: no such file, but w{j} did not remove it") from None
        allowed = view.refresh().allowed(rel)
        if got not in allowed:
            raise LoadError(f"w{self.idx} reading w{j}/{rel}: {n} bytes with sha256 {got[:16]}, which is no "
                            f"version w{j} wrote ({len(allowed)} known)")
        self.stats["bytes_verified"] += n
        self.stats["reads_other"] += 1

    def read_snapshot(self) -> None:
        """A file of a recorded snapshot: exactly the bytes recorded when it was taken."""
        self.snaps.refresh()
        live = sorted(n for n in self.snaps.files if n not in self.snaps.deleting and self.snaps.files[n])
        if not live:
            return
        name = self.rng.choice(live)
        rel, want = self.rng.choice(sorted(self.snaps.files[name].items()))
        try:
            got, n = sha_file(self.mnt / ".snapshots" / name / rel)
        except FileNotFoundError:
            if name in self.snaps.refresh().deleting:
                self.stats["reads_skipped"] += 1
                return
            raise LoadError(f"w{self.idx} reading snapshot {name}/{rel}: no such file, but the snapshot "
                            f"was not deleted") from None
        if got != want:
            raise LoadError(f"w{self.idx} reading snapshot {name}/{rel}: {n} bytes with sha256 {got[:16]}, "
                            f"recorded {want[:16]} when it was taken")
        self.stats["bytes_verified"] += n
        self.stats["reads_snapshot"] += 1
