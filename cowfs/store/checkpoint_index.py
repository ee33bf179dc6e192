"""Find the HF Trainer checkpoints (`checkpoint-N/trainer_state.json`) in the trees of
snapshots and the live tree, and tell them apart.

A checkpoint's identity is the body of its trainer_state.json (`content_id`): the same
save seen in many snapshots, or put back by `cowfs restore` (which shares the body), is
one checkpoint; two saves are two even with equal bytes (every commit makes a new body).

The search is bounded and cheap: it walks directories only, at most MAX_DEPTH below its
start and MAX_DIRS per tree, does not descend into checkpoint directories, and reads a
directory's subdirectories once per directory version (a directory gets a new version
row whenever its entries change, so trees that share the version share the listing).
Only the small trainer_state.json files are read, each body once.
"""
from __future__ import annotations

import sqlite3
import stat
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..errors import CowfsError
from . import namespace as ns
from .schema import KIND_DIR
from .trainer_state import MAX_STATE_BYTES, STATE_FILE, TrainerState, checkpoint_step, parse_trainer_state

if TYPE_CHECKING:
    from .snapshots import Snapshot
    from .store import Store

MAX_DEPTH = 8      # directory levels below the start that are searched
MAX_DIRS = 5000    # directories looked at per tree


@dataclass(frozen=True)
class Found:
    """A complete-looking checkpoint directory in one tree (its trainer_state.json committed)."""

    path: str        # the checkpoint directory
    state_ino: int   # its trainer_state.json
    content_id: int  # that file's body: the checkpoint's identity
    data_gen: int    # the generation that wrote that body (a restore's own generation for a restored copy)


class TreeWalker:
    """Searches trees as of any generation through one read connection, remembering
    directory listings by directory version."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.truncated = False  # some tree had more than MAX_DIRS directories (the rest was not searched)
        self._subdirs: dict[tuple[int, int], list[tuple[str, int]]] = {}
        self._state_ino: dict[tuple[int, int], int | None] = {}

    def _vid(self, ino: int, gen: int) -> int | None:
        """The version of directory `ino` as of `gen` (None: not a directory then)."""
        row = ns.version_row(self.conn, ino, gen)
        return row.vid if row is not None and stat.S_ISDIR(row.mode) else None

    def _children_dirs(self, ino: int, vid: int, gen: int) -> list[tuple[str, int]]:
        key = (ino, vid)
        if key not in self._subdirs:
            rows = self.conn.execute(
                "SELECT d.name, d.ino FROM dentries d JOIN inodes i ON i.ino = d.ino"
                " WHERE d.parent=? AND d.birth_gen<=? AND d.death_gen>? AND i.kind=? ORDER BY d.name",
                (ino, gen, gen, KIND_DIR)).fetchall()
            self._subdirs[key] = [(bytes(name).decode(errors="replace"), child) for name, child in rows]
        return self._subdirs[key]

    def _state_file(self, dir_ino: int, gen: int) -> tuple[int, int, int] | None:
        """(ino, content_id, data_gen) of the directory's trainer_state.json as of `gen`,
        if it is a regular file with a committed, non-empty body."""
        vid = self._vid(dir_ino, gen)
        if vid is None:
            return None
        key = (dir_ino, vid)
        if key not in self._state_ino:
            row = self.conn.execute(
                "SELECT ino FROM dentries WHERE parent=? AND name=? AND birth_gen<=? AND death_gen>?",
                (dir_ino, STATE_FILE.encode(), gen, gen)).fetchone()
            self._state_ino[key] = None if row is None else int(row[0])
        ino = self._state_ino[key]
        if ino is None:
            return None
        v = ns.version_row(self.conn, ino, gen)
        if v is None or v.content_id is None or v.size == 0 or not stat.S_ISREG(v.mode):
            return None
        return ino, v.content_id, v.data_gen

    def checkpoints(self, gen: int, under: str = "/") -> list[Found]:
        """The checkpoint directories with a committed trainer_state.json under `under`, as of `gen`."""
        try:
            start = ns.resolve(self.conn, under, gen)
        except CowfsError:  # not there in this tree
            return []
        if not start.is_dir:
            return []
        top = "/" + under.strip("/")
        found: list[Found] = []
        if checkpoint_step(top.rsplit("/", 1)[-1]) is not None:  # asked about one checkpoint
            state = self._state_file(start.ino, gen)
            return [Found(top, *state)] if state else []
        stack = [(start.ino, top, 0)]
        visited = 0
        while stack:
            ino, path, depth = stack.pop()
            visited += 1
            if visited > MAX_DIRS:
                self.truncated = True
                break
            vid = self._vid(ino, gen)
            if vid is None:
                continue
            for name, child in self._children_dirs(ino, vid, gen):
                child_path = f"{path.rstrip('/')}/{name}"
                if checkpoint_step(name) is not None:
                    state = self._state_file(child, gen)
                    if state is not None:
                        found.append(Found(child_path, *state))
                elif depth + 1 < MAX_DEPTH:
                    stack.append((child, child_path, depth + 1))
        return sorted(found, key=lambda f: f.path)


@dataclass(frozen=True)
class Location:
    """Where a checkpoint is: a snapshot (or the live tree: None) and its path there."""

    snapshot: str | None
    generation: int  # of that tree
    path: str
    state_ino: int
    data_gen: int


@dataclass
class Checkpoint:
    key: int              # the body of its trainer_state.json
    state: TrainerState
    saved_gen: int        # the generation that first wrote it
    saved_ns: int
    locations: list[Location] = field(default_factory=list)
    own_snapshot: str | None = None  # the first snapshot in which it is the newest checkpoint (its --snapshot-on one)

    @property
    def live(self) -> Location | None:
        return next((loc for loc in self.locations if loc.snapshot is None), None)

    @property
    def snapshots(self) -> list[str]:
        return [loc.snapshot for loc in self.locations if loc.snapshot is not None]

    @property
    def restore_from(self) -> Location | None:
        """The snapshot to restore it from: its own, else the newest that holds it."""
        held = [loc for loc in self.locations if loc.snapshot is not None]
        own = [loc for loc in held if loc.snapshot == self.own_snapshot]
        return own[0] if own else (max(held, key=lambda loc: loc.generation) if held else None)

    @property
    def path(self) -> str:
        where = self.live or self.restore_from or self.locations[0]
        return where.path


@dataclass
class CheckpointIndex:
    checkpoints: list[Checkpoint]  # newest save first
    in_snapshot: dict[str, list[int]]  # snapshot name -> keys of the checkpoints it holds, the newest written first
    truncated: bool                # a tree was too large to search whole

    def by_key(self) -> dict[int, Checkpoint]:
        return {c.key: c for c in self.checkpoints}

    def main(self, snapshot: str) -> Checkpoint | None:
        """The checkpoint a snapshot is for: the one whose trainer_state.json it got last."""
        keys = self.in_snapshot.get(snapshot) or []
        return self.by_key().get(keys[0]) if keys else None


def build(store: "Store", snapshots: "list[Snapshot] | None" = None, live: bool = True,
          under: str = "/") -> CheckpointIndex:
    """Every Trainer checkpoint under `under` in `snapshots` (default: all) and the live tree."""
    trees: list[tuple[str | None, int]] = []

    def walk(conn: sqlite3.Connection) -> tuple[list[tuple[str | None, int, list[Found]]], bool, dict[int, int]]:
        snaps = snapshots if snapshots is not None else store.snapshot_list()
        trees.extend((s.name, s.gen) for s in snaps)
        if live:
            trees.append((None, ns.current_gen(conn)))
        walker = TreeWalker(conn)
        out = [(name, gen, walker.checkpoints(gen, under)) for name, gen in trees]
        gens = {f.data_gen for _, _, founds in out for f in founds}
        times = {g: t for g, t in conn.execute(
            "SELECT gen, time_ns FROM generations WHERE gen IN (%s)" % ",".join("?" * len(gens)), sorted(gens))} if gens else {}
        return out, walker.truncated, times

    per_tree, truncated, times = store.catalog.read(walk)
    located: dict[int, list[Location]] = {}
    in_snapshot: dict[str, list[int]] = {}
    for name, gen, founds in per_tree:
        for f in founds:
            located.setdefault(f.content_id, []).append(Location(name, gen, f.path, f.state_ino, f.data_gen))
        if name is not None:
            in_snapshot[name] = [f.content_id for f in sorted(founds, key=lambda f: f.data_gen, reverse=True)]
    checkpoints: list[Checkpoint] = []
    for key, locations in located.items():
        state = _read_state(store, locations[0])
        if state is None:
            continue
        saved = min(loc.data_gen for loc in locations)
        checkpoints.append(Checkpoint(key, state, saved, times.get(saved, 0), locations))
    known = {c.key: c for c in checkpoints}
    for name in list(in_snapshot):  # oldest first: a checkpoint's own snapshot is the first it is the newest in
        keys = [k for k in in_snapshot[name] if k in known]  # without the ones that did not parse
        if not keys:
            del in_snapshot[name]
            continue
        in_snapshot[name] = keys
        if known[keys[0]].own_snapshot is None:
            known[keys[0]].own_snapshot = name
    checkpoints.sort(key=lambda c: (c.saved_gen, c.state.global_step), reverse=True)
    return CheckpointIndex(checkpoints, in_snapshot, truncated)


def _read_state(store: "Store", loc: Location) -> TrainerState | None:
    """The parsed trainer_state.json at `loc`, or None if it is not one (or cannot be read)."""
    try:
        with store.open_reader(loc.state_ino, loc.generation) as reader:
            if reader.size > MAX_STATE_BYTES:
                return None
            data = bytes(reader.read(0, reader.size))
        return parse_trainer_state(data)
    except (ValueError, CowfsError):
        return None
