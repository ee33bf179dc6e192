"""The controller: next to the writers, it takes snapshots and checks them, deletes the
oldest ones (rmdir, `cowfs snapshot delete`, prune), and runs gc."""
from __future__ import annotations

import json
import os
import random
import threading
import time
from pathlib import Path
from typing import Callable

from .errors import LoadError, cowfs_or_fail
from .journal import Journal, WriterView, snapshot_journal_path, writer_journal_path
from .verify import compare_trees, tree_hashes


class Controller:
    """Two threads next to the writers: one takes, checks, records and deletes snapshots
    (and sometimes prunes), the other runs gc. Each action's failure is recorded, not fatal."""

    def __init__(self, store: Path, mnt: Path, workdir: Path, procs: int, rng: random.Random, keep: int,
                 snap_every: float, gc_every: float, max_snapshots: int, verbose: bool = False) -> None:
        self.store = store
        self.mnt = mnt
        self.rng = rng
        self.keep = keep
        self.snap_every = snap_every
        self.gc_every = gc_every
        self.max_snapshots = max_snapshots
        self.verbose = verbose
        self.journal = Journal(snapshot_journal_path(workdir))
        self.writers = {j: WriterView(writer_journal_path(workdir, j)) for j in range(procs)}
        self.live: dict[str, dict[str, str]] = {}  # recorded snapshots that exist, oldest first
        self.created = 0
        self.gc_runs = 0  # by the gc thread
        self.prunes = 0  # by the snapshot thread (each runs gc too)
        self.bytes_verified = 0
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._snapshot_loop, name="snapshots"),
                        threading.Thread(target=self._gc_loop, name="gc")]

    # -- threads -------------------------------------------------------------------------

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def join(self) -> None:
        self.stop.set()
        for t in self.threads:
            if t.ident is not None:  # started
                t.join()

    def _snapshot_loop(self) -> None:
        while not self.stop.wait(self.snap_every) and self.created < self.max_snapshots:
            self.attempt("snapshot", self.snapshot)
            self.attempt("delete old snapshots", self.trim)

    def _gc_loop(self) -> None:
        while not self.stop.wait(self.gc_every):
            self.attempt("gc", self.gc)

    def attempt(self, what: str, fn: Callable[[], None]) -> None:
        start = time.monotonic()
        try:
            fn()
        except LoadError as e:
            self.errors.append(f"controller: {what}: {e}")
        except Exception as e:  # noqa: BLE001 - reported, the run goes on
            self.errors.append(f"controller: {what}: {type(e).__name__}: {e}")
        if self.verbose:
            print(f"controller: {what} took {time.monotonic() - start:.2f}s", flush=True)

    # -- actions -------------------------------------------------------------------------

    def snapshot(self, name: str | None = None) -> None:
        name = name or f"load-{self.created:04d}"
        via = "cowfs snapshot create" if self.created % 2 == 0 else "mkdir"
        if via == "mkdir":
            os.mkdir(self.mnt / ".snapshots" / name)
        else:
            cowfs_or_fail("snapshot", "create", str(self.mnt), name)
        self.created += 1
        files, n = tree_hashes(self.mnt / ".snapshots" / name)
        self.bytes_verified += n
        self.check_versions(f"snapshot {name} (made by {via})", files)
        self.live[name] = files
        self.journal.rec("snap", name=name, files=files)

    def check_versions(self, what: str, files: dict[str, str]) -> None:
        """Every file must hold a version its writer began (or be empty while being created)."""
        for view in self.writers.values():
            view.refresh()
        for rel, digest in files.items():
            top, _, sub = rel.partition("/")
            j = int(top[1:]) if top.startswith("w") and top[1:].isdigit() else -1
            if j not in self.writers or not sub:
                raise LoadError(f"{what}: {rel}: a file no writer made")
            if digest not in self.writers[j].allowed(sub):
                raise LoadError(f"{what}: {rel} holds sha256 {digest[:16]}, which is no version w{j} wrote")

    def trim(self) -> None:
        """Delete the oldest snapshots beyond --keep-snapshots: rmdir, `cowfs snapshot delete`, or prune."""
        while len(self.live) > self.keep:
            how = self.rng.choice(("rmdir", "delete", "prune"))
            if how == "prune":
                self.prune(self.keep)
                continue
            name = next(iter(self.live))
            self.journal.rec("deleting", name=name)  # readers may see it vanish from now on
            if how == "rmdir":
                os.rmdir(self.mnt / ".snapshots" / name)
            else:
                cowfs_or_fail("snapshot", "delete", str(self.mnt), name)
            del self.live[name]

    def prune(self, keep_last: int) -> None:
        doomed = list(self.live)[:-keep_last]
        for name in doomed:
            self.journal.rec("deleting", name=name)
        r = cowfs_or_fail("prune", str(self.mnt), "--keep-last", str(keep_last), "--json")
        self.prunes += 1
        removed = [s["name"] for s in json.loads(r.stdout)["snapshots"] if not s["keep"]]
        for name in doomed:
            del self.live[name]
        if sorted(removed) != sorted(doomed):
            raise LoadError(f"prune --keep-last {keep_last} removed {removed}, expected {doomed}")

    def gc(self) -> None:
        cowfs_or_fail("gc", str(self.mnt if self.gc_runs % 2 == 0 else self.store))
        self.gc_runs += 1

    def check_live_tree(self, expected: dict[str, str], skip: set[str]) -> None:
        """The live tree through the mount: exactly every writer's last committed versions."""
        got, n = tree_hashes(self.mnt)
        self.bytes_verified += n
        for problem in compare_trees(got, expected, skip):
            self.errors.append(f"live tree (mounted): {problem}")
