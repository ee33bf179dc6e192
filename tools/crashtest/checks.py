"""The checks after remounting: every live path in a state the writer's log allows and
loadable, every retained snapshot byte-exact as recorded and, once, a moment of the
writer's log while its mkdir ran."""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

from .cycle import Cycle
from .errors import HarnessError
from .oracle import AllowedStates
from .snapshots import RecordedSnapshot, SnapshotBook
from .states import DIR, EMPTY, PathState, walk_tree


class CheckpointLoader:
    """Loads a file with the library that wrote it; once per distinct content."""

    def __init__(self) -> None:
        self.loaded: set[str] = set()  # shas already loaded with torch/safetensors/json

    def load(self, name: str, path: Path, digest: str) -> None:
        """The file must load with the library that wrote it (`name`: the path it was written
        at); once per distinct content."""
        if digest in self.loaded:
            return
        if name.endswith(".pt"):
            import torch
            torch.load(path, map_location="cpu", weights_only=True)
        elif ".safetensors" in name:
            from safetensors.torch import load_file
            load_file(str(path))
        elif name.endswith(".json"):
            json.loads(path.read_text())
        else:
            raise HarnessError(f"no loader for {name}")
        self.loaded.add(digest)


class RemountCheck:
    """Checks of the remounted tree against the allowed states and the recorded snapshots."""

    def __init__(self, mnt: Path, oracle: AllowedStates, snapshots: SnapshotBook, loader: CheckpointLoader) -> None:
        self.mnt = mnt
        self.oracle = oracle
        self.snapshots = snapshots
        self.loader = loader

    def run(self, cyc: Cycle, problems: list[str]) -> tuple[int, int, int]:
        """(bytes verified, live files checked, snapshots checked); the allowed states settle on
        what is live."""
        try:
            tree = walk_tree(self.mnt)
        except OSError as e:
            problems.append(f"walking the live tree: {e!r}")
            vbytes, nsnaps = self.check_snapshots(cyc, problems)
            return vbytes, 0, nsnaps  # no settle: the model keeps what the live tree should be
        live = {p: st for p, (st, _) in tree.items()}
        verified, nfiles = self.check_live(tree, live, problems)
        vbytes, nsnaps = self.check_snapshots(cyc, problems)
        self.oracle.settle(live)
        return verified + vbytes, nfiles, nsnaps

    def check_live(self, tree: dict[str, tuple[str, int]], live: dict[str, PathState],
                   problems: list[str]) -> tuple[int, int]:
        """Every live path in an allowed state, renames all or nothing, every file loads."""
        oracle = self.oracle
        verified = nfiles = 0
        for p in sorted(set(live) | {p for p, a in oracle.allowed.items() if a != {None}}):
            got, allowed = live.get(p), oracle.get(p)
            if got not in allowed and not (allowed == {None} and oracle.may_be_save_file_tmp(p, got)):
                problems.append(f"{p}: live state {oracle.describe(got)}; allowed: {oracle.describe_all(allowed)}")
            elif got not in (None, DIR):
                nfiles += 1
                verified += tree[p][1]
        for rn in oracle.renames:
            if rn.t_done == math.inf and (bad := oracle.rename_violation(rn, live.get(rn.src), live.get(rn.dst))):
                problems.append(bad)
        for p, st in sorted(live.items()):
            if st not in (None, DIR, EMPTY):
                try:
                    self.loader.load(p, self.mnt / p, st)
                except Exception as e:  # noqa: BLE001 - reported
                    problems.append(f"{p}: does not load: {e!r}")
        return verified, nfiles

    def check_snapshots(self, cyc: Cycle, problems: list[str]) -> tuple[int, int]:
        """(bytes verified, snapshots checked)."""
        book = self.snapshots
        verified = nsnaps = 0
        try:
            present = set(os.listdir(book.dir))
        except OSError as e:
            problems.append(f"listing .snapshots: {e!r}")
            present = set()
        for name in list(book.recorded):
            if name not in present:
                if book.uncertain.get(name) != "rmdir":
                    problems.append(f"snapshot {name} (taken in cycle {book.recorded[name].cycle + 1}) is gone")
                book.uncertain.pop(name, None)
                del book.recorded[name]
        for name in sorted(present):
            snap = book.recorded.get(name)
            if snap is None:
                if book.uncertain.get(name) != "mkdir":
                    problems.append(f"unknown snapshot {name} in .snapshots")
                    continue
                snap = RecordedSnapshot(name, cyc.index)  # its mkdir was interrupted by the kill but it exists
            checked = self.check_snapshot(cyc, snap, problems)
            if checked is not None:
                verified += checked
                nsnaps += 1
        for name in [n for n in book.uncertain if n not in present]:
            del book.uncertain[name]  # an interrupted mkdir that never happened, or an rmdir that did
        return verified, nsnaps

    def check_snapshot(self, cyc: Cycle, snap: RecordedSnapshot, problems: list[str]) -> int | None:
        """Byte-exact, every time (recorded now if the kill interrupted its mkdir); against the
        writer's log once. Bytes verified, None if it could not be read."""
        book, name = self.snapshots, snap.name
        try:
            files = walk_tree(book.dir / name)
        except OSError as e:
            problems.append(f"snapshot {name}: reading it: {e!r}")
            return None
        if snap.files is None:
            snap.files = files
            book.recorded[name] = snap
        book.uncertain.pop(name, None)
        verified = 0
        for p in sorted(set(files) | set(snap.files)):
            want, got = snap.files.get(p), files.get(p)
            if want != got:
                problems.append(f"snapshot {name}: {p} is {self.oracle.describe(got and got[0])}, "
                                f"recorded {self.oracle.describe(want and want[0])} when the snapshot was taken")
            elif got[0] != DIR:
                verified += got[1]
        if not snap.validated:  # once: against the writer's log while its mkdir ran
            problems.extend(self.snapshot_vs_log(cyc, name, snap.files))
            snap.validated = True
        return verified

    def snapshot_vs_log(self, cyc: Cycle, name: str, files: dict[str, tuple[str, int]]) -> list[str]:
        """A snapshot is the tree at one moment while its mkdir ran: every path as the writer's log
        allows then (present or absent, a complete version), renames all or nothing; files load."""
        oracle = self.oracle
        if name not in cyc.snap_states:
            return [f"snapshot {name}: taken in cycle {cyc.index + 1} but no mkdir of it was seen"]
        states = cyc.snap_states[name]
        t1, t2 = cyc.snap_windows[name][0], min(cyc.snap_windows[name][1], cyc.t_kill)
        out = []
        for p in sorted(set(files) | {p for p, s in states.items() if None not in s}):
            got = files[p][0] if p in files else None
            allowed = states.get(p, {None})
            if got not in allowed and not (allowed == {None} and oracle.may_be_save_file_tmp(p, got, ever=True)):
                out.append(f"snapshot {name}: {p} is {oracle.describe(got)}; while its mkdir ran "
                           f"({t2 - t1:.3f}s) the writer's log allows: {oracle.describe_all(allowed)}")
            elif got not in (None, DIR, EMPTY):
                try:
                    self.loader.load(p, self.snapshots.dir / name / p, got)
                except Exception as e:  # noqa: BLE001 - reported
                    out.append(f"snapshot {name}: {p} does not load: {e!r}")

        def state(p: str) -> PathState:
            return files[p][0] if p in files else None

        for rn in cyc.renames:  # the rename, if the snapshot's moment may fall in it
            if rn.t_src_closed < t1 and t2 < rn.t_next and t1 <= rn.t_done and rn.t_begin <= t2:
                if bad := oracle.rename_violation(rn, state(rn.src), state(rn.dst)):
                    out.append(f"snapshot {name}: {bad}")
        return out
