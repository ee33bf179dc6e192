"""Index the complete checkpoints of every kind rules.py knows (HF Trainer,
Lightning, DCP, DeepSpeed; walk.py finds them) in the trees of snapshots and
the live tree, and tell them apart.

A checkpoint's identity is the body of the file that marks it (`content_id`): a Trainer
checkpoint's trainer_state.json, a Lightning `.ckpt`, a DCP `.metadata`, a DeepSpeed tag
directory's first file. The same save seen in many snapshots, or put back by `cowfs
restore` (which shares the bodies), is one checkpoint; two saves are two even with equal
bytes (every commit makes a new body). A DeepSpeed tag directory is a checkpoint if its
`latest` named it in some tree; then it is found in every tree holding it.

Only the small trainer_state.json and `latest` files are read, each body once; no torch
file is read, so only Trainer checkpoints have an epoch and metrics.
"""
from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ...errors import CowfsError
from ..catalog import namespace as ns
from . import dcp_files, rules
from .trainer_state import MAX_STATE_BYTES, TrainerState, parse_trainer_state
from .walk import ALL_KINDS, MAX_DEPTH, MAX_DIRS, TRAINER_ONLY, Found, TreeWalker

if TYPE_CHECKING:
    from ..catalog.snapshots import Snapshot
    from ..store import Store


@dataclass(frozen=True)
class Location:
    """Where a checkpoint is: a snapshot (or the live tree: None) and its path there."""

    snapshot: str | None
    generation: int  # of that tree
    path: str
    state_ino: int  # the file whose body is the checkpoint's identity
    data_gen: int


@dataclass
class Checkpoint:
    key: int                    # the body of the file that marks it
    kind: str                   # rules.TRAINER, LIGHTNING, DCP or DEEPSPEED
    state: TrainerState | None  # a Trainer checkpoint's trainer_state.json (None for the other kinds)
    step: int | None            # from trainer_state.json, else from the name (None: the name has none)
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
    def is_dir(self) -> bool:
        return self.kind != rules.LIGHTNING

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
        """The checkpoint a snapshot is for: the one whose marking file it got last."""
        keys = self.in_snapshot.get(snapshot) or []
        return self.by_key().get(keys[0]) if keys else None


def build(store: "Store", snapshots: "list[Snapshot] | None" = None, live: bool = True,
          under: str = "/", kinds: frozenset[str] = ALL_KINDS) -> CheckpointIndex:
    """Every checkpoint of `kinds` under `under` in `snapshots` (default: all) and the live tree."""
    trees: list[tuple[str | None, int]] = []

    def walk(conn: sqlite3.Connection) -> tuple[list[tuple[str | None, int, list[Found]]], bool, dict[int, int]]:
        snaps = snapshots if snapshots is not None else store.snapshot_list()
        trees.extend((s.name, s.gen) for s in snaps)
        if live:
            trees.append((None, ns.current_gen(conn)))
        walker = TreeWalker(conn)
        out = [(name, gen, walker.checkpoints(gen, under, kinds)) for name, gen in trees]
        gens = {f.data_gen for _, _, founds in out for f in founds}
        times = {g: t for g, t in conn.execute(
            "SELECT gen, time_ns FROM generations WHERE gen IN (%s)" % ",".join("?" * len(gens)), sorted(gens))} if gens else {}
        return out, walker.truncated, times

    per_tree, truncated, times = store.catalog.read(walk)
    per_tree = _dcp_whole(store, _deepspeed_named(store, per_tree))
    located: dict[int, list[Location]] = {}
    kind_of: dict[int, str] = {}
    in_snapshot: dict[str, list[int]] = {}
    for name, gen, founds in per_tree:
        for f in founds:
            located.setdefault(f.content_id, []).append(Location(name, gen, f.path, f.state_ino, f.data_gen))
            kind_of[f.content_id] = f.kind
        if name is not None:
            in_snapshot[name] = [f.content_id for f in sorted(founds, key=lambda f: f.data_gen, reverse=True)]
    checkpoints: list[Checkpoint] = []
    for key, locations in located.items():
        kind = kind_of[key]
        state = _read_state(store, locations[0]) if kind == rules.TRAINER else None
        if kind == rules.TRAINER and state is None:
            continue
        saved = min(loc.data_gen for loc in locations)
        step = state.global_step if state is not None else _step_of(kind, locations[0].path)
        checkpoints.append(Checkpoint(key, kind, state, step, saved, times.get(saved, 0), locations))
    known = {c.key: c for c in checkpoints}
    for name in list(in_snapshot):  # oldest first: a checkpoint's own snapshot is the first it is the newest in
        keys = [k for k in in_snapshot[name] if k in known]  # without the ones that did not parse
        if not keys:
            del in_snapshot[name]
            continue
        in_snapshot[name] = keys
        if known[keys[0]].own_snapshot is None:
            known[keys[0]].own_snapshot = name
    checkpoints.sort(key=lambda c: (c.saved_gen, -1 if c.step is None else c.step), reverse=True)
    return CheckpointIndex(checkpoints, in_snapshot, truncated)


def _step_of(kind: str, path: str) -> int | None:
    """The step in a Lightning file's, DCP directory's or DeepSpeed tag's name, if any."""
    name = path.rsplit("/", 1)[-1]
    return rules.lightning_step(name) if kind == rules.LIGHTNING else rules.trailing_step(name)


def _deepspeed_named(store: "Store", per_tree: list[tuple[str | None, int, list[Found]]]
                     ) -> list[tuple[str | None, int, list[Found]]]:
    """Keep the DeepSpeed candidates that are checkpoints: a tag directory its `latest` names
    in that tree, or the same save (the same first file's body) in another tree."""
    tags: dict[int, str | None] = {}
    for _, gen, founds in per_tree:
        for f in founds:
            if f.latest is not None and f.latest[1] not in tags:
                tags[f.latest[1]] = _read_tag(store, f.latest[0], gen)
    named = {f.content_id for _, _, founds in per_tree for f in founds
             if f.latest is not None and tags[f.latest[1]] == f.path.rsplit("/", 1)[-1]}
    out = []
    for name, gen, founds in per_tree:
        kept = []
        for f in founds:
            if f.latest is None:
                kept.append(f)
            elif f.content_id in named:
                kept.append(f)
        out.append((name, gen, kept))
    return out


def _dcp_whole(store: "Store", per_tree: list[tuple[str | None, int, list[Found]]]
               ) -> list[tuple[str | None, int, list[Found]]]:
    """Keep the DCP checkpoints whose `.metadata` names no data file missing in that tree
    (dcp_files.py: across stores, the coordinator's file can show before the others')."""
    names: dict[int, set[str] | None] = {}
    out = []
    for tree, gen, founds in per_tree:
        kept = []
        for f in founds:
            if f.kind == rules.DCP:
                if f.content_id not in names:
                    names[f.content_id] = _read_names(store, f.state_ino, gen)
                want = names[f.content_id]
                if want:
                    try:
                        dir_ino = store.resolve(f.path, gen).ino
                    except CowfsError:
                        continue
                    if store.catalog.read(lambda c, d=dir_ino, w=want: dcp_files.missing_files(c, d, gen, w)):
                        continue
            kept.append(f)
        out.append((tree, gen, kept))
    return out


def _small_file(store: "Store", ino: int, gen: int, limit: int) -> bytes | None:
    """The file's bytes as of `gen`; None when larger than `limit` or unreadable."""
    try:
        with store.open_reader(ino, gen) as reader:
            return None if reader.size > limit else bytes(reader.read(0, reader.size))
    except CowfsError:
        return None


def _read_names(store: "Store", ino: int, gen: int) -> set[str] | None:
    blob = _small_file(store, ino, gen, dcp_files.MAX_METADATA_BYTES)
    return None if blob is None else dcp_files.named_files(blob)


def _read_tag(store: "Store", ino: int, gen: int) -> str | None:
    blob = _small_file(store, ino, gen, rules.MAX_TAG_BYTES)
    return None if blob is None else rules.deepspeed_tag(blob)


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


__all__ = ["build", "Checkpoint", "CheckpointIndex", "Location", "Found", "TreeWalker", "ALL_KINDS", "TRAINER_ONLY",
           "MAX_DEPTH", "MAX_DIRS"]
