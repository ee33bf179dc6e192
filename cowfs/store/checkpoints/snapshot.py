"""Taking the snapshot of a completed checkpoint (the daemon's `--snapshot-on checkpoint`;
rules.py says which changes may complete one).

`plan` checks, as of the generation G of the completing commit, that the checkpoint is
complete (a Trainer's trainer_state.json parses, a `.ckpt` or `.metadata` is a non-empty
file, DeepSpeed's `latest` names a directory) and names the snapshot. The snapshot then
pins G itself, so it shows the tree exactly as that commit left it, however much has been
written since, unless a file of the checkpoint's directory was still open for writing or
has been written after G (`still_written`: a late rank); then the daemon waits for a
moment when no file is open for writing and snapshots that moment instead.
"""
from __future__ import annotations

import sqlite3
import stat
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...errors import CowfsError, Exists, NotFound
from ..catalog import namespace as ns
from ..catalog.schema import ROOT_INO
from . import dcp_files, rules
from .rules import Trigger
from .trainer_state import MAX_STATE_BYTES, STATE_FILE, checkpoint_step, parse_trainer_state
from .walk import TreeWalker

if TYPE_CHECKING:
    from ..catalog.snapshots import Snapshot
    from ..store import Store

MAX_TAG_BYTES = rules.MAX_TAG_BYTES


class NotComplete(Exception):
    """The change did not complete a checkpoint (the reason is the message)."""


class MissingFiles(NotComplete):
    """A DCP `.metadata` names data files not there yet (across stores, another node's files
    can arrive after it: a consumer of the union looks again when they do)."""

    def __init__(self, message: str, directory: str) -> None:
        super().__init__(message)
        self.directory = directory


@dataclass(frozen=True)
class Plan:
    trigger: Trigger
    name: str               # the snapshot's name before any suffix: RUN@step-N
    checkpoint: str         # the checkpoint: its directory, or its file (Lightning)
    directory: str | None   # the directory whose files must all be closed (None: one file)
    content_id: int         # the completing file's body as of the trigger's generation


def _read(store: "Store", ino: int, gen: int, limit: int) -> bytes:
    with store.open_reader(ino, gen) as reader:
        if reader.size > limit:
            raise NotComplete(f"larger than {limit} bytes")
        return bytes(reader.read(0, reader.size))


def _dcp_whole(store: "Store", path: str, directory: str, metadata_ino: int, gen: int) -> None:
    """NotComplete unless every data file the `.metadata` names is there as of `gen`."""
    try:
        names = dcp_files.named_files(_read(store, metadata_ino, gen, dcp_files.MAX_METADATA_BYTES))
    except NotComplete:
        return  # too large to read: taken as whole, as before
    if not names:
        return
    dir_ino = store.resolve(directory, gen).ino
    missing = store.catalog.read(lambda conn: dcp_files.missing_files(conn, dir_ino, gen, names))
    if missing:
        raise MissingFiles(f"{path} names {len(missing)} data files not there yet ({', '.join(missing[:3])})",
                           directory)


def plan(store: "Store", trigger: Trigger) -> Plan:
    """What to snapshot for `trigger`, checked as of its generation; NotComplete if nothing."""
    gen = trigger.generation
    try:
        attr = store.resolve(trigger.path, gen)
    except CowfsError as e:
        raise NotComplete(f"{trigger.path}: not there at generation {gen} ({e})") from None
    if not attr.is_file or attr.content_id is None or attr.size == 0:
        raise NotComplete(f"{trigger.path}: not a non-empty regular file at generation {gen}")
    directory, name = trigger.path.rsplit("/", 1)
    directory = directory or "/"
    if trigger.kind == rules.TRAINER:
        try:
            state = parse_trainer_state(_read(store, attr.ino, gen, MAX_STATE_BYTES))
        except ValueError as e:
            raise NotComplete(f"{trigger.path}: not a trainer state ({e})") from None
        step = checkpoint_step(directory.rsplit("/", 1)[-1])
        label = f"step-{step if step is not None else state.global_step}"
        return Plan(trigger, rules.snapshot_name(rules.run_of(trigger, directory), label), directory, directory,
                    attr.content_id)
    if trigger.kind == rules.LIGHTNING:
        return Plan(trigger, rules.snapshot_name(rules.run_of(trigger, trigger.path), rules.lightning_label(name)),
                    trigger.path, None, attr.content_id)
    if trigger.kind == rules.DCP:
        _dcp_whole(store, trigger.path, directory, attr.ino, gen)
        label = rules.step_label(directory.rsplit("/", 1)[-1] or "root")
        return Plan(trigger, rules.snapshot_name(rules.run_of(trigger, directory), label), directory, directory,
                    attr.content_id)
    tag = rules.deepspeed_tag(_read(store, attr.ino, gen, MAX_TAG_BYTES))
    if tag is None:
        raise NotComplete(f"{trigger.path}: does not hold a checkpoint tag")
    tag_dir = f"{directory.rstrip('/')}/{tag}"
    try:
        if not store.resolve(tag_dir, gen).is_dir:
            raise NotComplete(f"{tag_dir}: not a directory")
    except NotFound:
        raise NotComplete(f"{trigger.path} names {tag}, which does not exist") from None
    return Plan(trigger, rules.snapshot_name(rules.run_of(trigger, tag_dir), rules.step_label(tag)), tag_dir, tag_dir,
                attr.content_id)


def already_snapshotted(store: "Store", p: Plan) -> str | None:
    """A snapshot that already holds this checkpoint, if the completing file's body is older
    than the trigger (a restore, a rename or link of a finished file) and a snapshot has that
    body at the same path; None for a new save, which always gets its own snapshot."""

    def fn(conn: sqlite3.Connection) -> str | None:
        first = conn.execute("SELECT min(data_gen) FROM versions WHERE content_id=?", (p.content_id,)).fetchone()[0]
        if first is None or first >= p.trigger.generation:
            return None
        rows = conn.execute(
            "SELECT DISTINCT s.name, s.gen FROM versions v JOIN snapshots s ON s.gen >= v.birth_gen AND s.gen < v.death_gen"
            " WHERE v.content_id=? ORDER BY s.gen", (p.content_id,)).fetchall()
        for name, gen in rows:
            try:
                if ns.resolve(conn, p.trigger.path, gen).content_id == p.content_id:
                    return str(name)
            except CowfsError:
                continue
        return None

    return store.catalog.read(fn)


def still_written(store: "Store", p: Plan, writing: list[int]) -> bool:
    """Whether the checkpoint's directory has a file open for writing (`writing`: the inodes
    of the open write sessions) or written after the trigger's generation: then it was not
    whole at that generation."""
    if p.directory is None:
        return False
    top = p.directory.rstrip("/") + "/"

    def fn(conn: sqlite3.Connection) -> bool:
        gen = ns.current_gen(conn)
        for ino in writing:
            if any(path.startswith(top) for path in ns.paths_of(conn, ino, gen)):
                return True
        try:
            start = ns.resolve(conn, p.directory, gen)
        except CowfsError:
            return False  # gone since (rotated away): nothing can be written into it
        stack = [start.ino]
        while stack:
            for _name, child in ns.readdir(conn, stack.pop(), gen):
                if child.data_gen > p.trigger.generation:
                    return True
                if stat.S_ISDIR(child.mode):
                    stack.append(child.ino)
        return False

    return store.catalog.read(fn)


def take(store: "Store", base: str, gen: int | None) -> "Snapshot":
    """Snapshot as of `gen` (None: now) named `base`, or `base.2`, `base.3`... if taken.
    HistoryDropped if `gen` can no longer be pinned."""
    for _ in range(100):  # a name taken between the look and the create: look again
        taken = {s.name for s in store.snapshot_list()}
        try:
            return store.snapshot_create(rules.name_with_suffix(base, taken), gen)
        except Exists:
            continue
    raise Exists(f"snapshot {base!r}: no free name")


def take_now(store: "Store", p: Plan) -> "Snapshot":
    """Snapshot the tree as of now for `p`, if its completing file is still there with the
    body it had (NotComplete otherwise: gone or rewritten since)."""
    try:
        now = store.resolve(p.trigger.path)
    except CowfsError:
        now = None
    if now is None or now.content_id != p.content_id:
        raise NotComplete(f"{p.trigger.path}: gone or rewritten since generation {p.trigger.generation}")
    return take(store, p.name, None)


def _named_since(conn: sqlite3.Connection, path: str, gen: int) -> int:
    """The generation since which every entry on `path` (as of `gen`) has named what it names."""
    since, parent = 1, ROOT_INO
    for part in path.strip("/").split("/"):
        row = conn.execute("SELECT ino, birth_gen FROM dentries WHERE parent=? AND name=? AND birth_gen<=? AND death_gen>?",
                           (parent, part.encode(), gen, gen)).fetchone()
        if row is None:
            return gen
        parent, since = int(row[0]), max(since, int(row[1]))
    return since


def missed(store: "Store") -> list[Trigger]:
    """Trainer checkpoints in the live tree that no snapshot holds (the daemon stopped
    between a checkpoint's commit and its snapshot, or the store was mounted without
    --snapshot-on): a trigger for each, at the first generation at which its path held its
    trainer_state.json (the commit that wrote it, or a rename into place after it)."""

    def fn(conn: sqlite3.Connection) -> list[Trigger]:
        out = []
        gen = ns.current_gen(conn)
        for found in TreeWalker(conn).checkpoints(gen):
            held = conn.execute(
                "SELECT 1 FROM versions v JOIN snapshots s ON s.gen >= v.birth_gen AND s.gen < v.death_gen"
                " WHERE v.content_id=? LIMIT 1", (found.content_id,)).fetchone()
            if held is None:
                path = f"{found.path}/{STATE_FILE}"
                out.append(Trigger(rules.TRAINER, path, max(found.data_gen, _named_since(conn, path, gen))))
        return out

    return store.catalog.read(fn)
