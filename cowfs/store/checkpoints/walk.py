"""Find the complete checkpoints of every kind rules.py knows in the tree as of
one generation, cheaply (index.py builds the index over many trees from it).

  HF Trainer   a `checkpoint-N/` directory with a committed trainer_state.json
  Lightning    a committed, non-empty regular `NAME.ckpt` file
  DCP          a directory holding a committed, non-empty `.metadata` file
  DeepSpeed    a subdirectory of a directory holding a `latest` file; which one `latest`
               names is read afterwards (index.py), so every subdirectory with
               a regular file is a candidate here

Each is found with the file whose body is its identity: trainer_state.json, the `.ckpt`,
`.metadata`, and for a DeepSpeed tag directory its first non-empty regular file by name.

The search walks directories only, at most MAX_DEPTH below its start and MAX_DIRS per tree
(DeepSpeed candidates count), does not descend into Trainer or DCP checkpoint directories,
and reads a directory's subdirectories and checkpoint-marking files once per directory
version (a directory gets a new version row whenever its entries change, so trees that
share the version share the listing). It reads no file body.
"""
from __future__ import annotations

import sqlite3
import stat
from dataclasses import dataclass

from ...errors import CowfsError
from ..catalog import namespace as ns
from ..catalog.schema import KIND_DIR, KIND_FILE
from . import rules
from .trainer_state import STATE_FILE, checkpoint_step

MAX_DEPTH = 8      # directory levels below the start that are searched
MAX_DIRS = 5000    # directories looked at per tree
MAX_TAG_FILES = 16  # files of a DeepSpeed candidate looked at for a non-empty one

ALL_KINDS = frozenset({rules.TRAINER, rules.LIGHTNING, rules.DCP, rules.DEEPSPEED})
TRAINER_ONLY = frozenset({rules.TRAINER})

Body = tuple[int, int, int]  # (ino, content_id, data_gen) of a committed, non-empty regular file


@dataclass(frozen=True)
class Found:
    """A complete-looking checkpoint in one tree."""

    path: str        # the checkpoint: its directory, or its file (Lightning)
    state_ino: int   # the file whose body is its identity (trainer_state.json for a Trainer checkpoint)
    content_id: int  # that file's body: the checkpoint's identity
    data_gen: int    # the generation that wrote that body (a restore's own generation for a restored copy)
    kind: str = rules.TRAINER
    latest: Body | None = None  # DeepSpeed: the `latest` file beside the candidate tag directory


class TreeWalker:
    """Searches trees as of any generation through one read connection, remembering
    directory listings by directory version."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.truncated = False  # some tree had more than MAX_DIRS directories (the rest was not searched)
        self._entries: dict[tuple[int, int], list[tuple[str, int, bool]]] = {}
        self._state_ino: dict[tuple[int, int], int | None] = {}
        self._files: dict[tuple[int, int], list[int]] = {}

    def _vid(self, ino: int, gen: int) -> int | None:
        """The version of directory `ino` as of `gen` (None: not a directory then)."""
        row = ns.version_row(self.conn, ino, gen)
        return row.vid if row is not None and stat.S_ISDIR(row.mode) else None

    def _children(self, ino: int, vid: int, gen: int) -> list[tuple[str, int, bool]]:
        """(name, ino, is_dir) of the subdirectories and of the files named like a checkpoint
        marker (`.metadata`, `latest`, `*.ckpt`), by name."""
        key = (ino, vid)
        if key not in self._entries:
            suffix = rules.LIGHTNING_SUFFIX.encode()
            rows = self.conn.execute(
                "SELECT d.name, d.ino, i.kind FROM dentries d JOIN inodes i ON i.ino = d.ino"
                " WHERE d.parent=? AND d.birth_gen<=? AND d.death_gen>? AND (i.kind=? OR d.name IN (?, ?)"
                " OR (length(d.name) > ? AND substr(d.name, ?) = ?)) ORDER BY d.name",
                (ino, gen, gen, KIND_DIR, rules.DCP_METADATA.encode(), rules.DEEPSPEED_LATEST.encode(),
                 len(suffix), -len(suffix), suffix)).fetchall()
            self._entries[key] = [(bytes(name).decode(errors="replace"), child, kind == KIND_DIR)
                                  for name, child, kind in rows]
        return self._entries[key]

    def _body(self, ino: int, gen: int) -> Body | None:
        v = ns.version_row(self.conn, ino, gen)
        if v is None or v.content_id is None or v.size == 0 or not stat.S_ISREG(v.mode):
            return None
        return ino, v.content_id, v.data_gen

    def _state_file(self, dir_ino: int, gen: int) -> Body | None:
        """The directory's trainer_state.json as of `gen`, if committed and non-empty."""
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
        return None if ino is None else self._body(ino, gen)

    def _first_file(self, dir_ino: int, gen: int) -> Body | None:
        """The first non-empty regular file (by name) of a directory as of `gen`."""
        vid = self._vid(dir_ino, gen)
        if vid is None:
            return None
        key = (dir_ino, vid)
        if key not in self._files:
            self._files[key] = [int(r[0]) for r in self.conn.execute(
                "SELECT d.ino FROM dentries d JOIN inodes i ON i.ino = d.ino WHERE d.parent=? AND d.birth_gen<=?"
                " AND d.death_gen>? AND i.kind=? ORDER BY d.name LIMIT ?",
                (dir_ino, gen, gen, KIND_FILE, MAX_TAG_FILES))]
        return next((b for b in (self._body(ino, gen) for ino in self._files[key]) if b is not None), None)

    def checkpoints(self, gen: int, under: str = "/", kinds: frozenset[str] = TRAINER_ONLY) -> list[Found]:
        """The complete checkpoints of `kinds` under `under`, as of `gen`, by path."""
        try:
            start = ns.resolve(self.conn, under, gen)
        except CowfsError:  # not there in this tree
            return []
        top = "/" + under.strip("/")
        parent, _, name = top.rpartition("/")
        if rules.in_trainer_checkpoint(parent):  # inside a Trainer checkpoint: part of it, nothing of its own
            return []
        if start.is_file:  # asked about one file
            body = self._body(start.ino, gen) if rules.LIGHTNING in kinds and rules.is_lightning_file(name) else None
            return [Found(top, *body, rules.LIGHTNING)] if body else []
        if not start.is_dir:
            return []
        if checkpoint_step(name) is not None:  # asked about one Trainer checkpoint
            state = self._state_file(start.ino, gen) if rules.TRAINER in kinds else None
            return [Found(top, *state)] if state else []
        found: list[Found] = []
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
            children = self._children(ino, vid, gen)
            files = {n: child for n, child, is_dir in children if not is_dir}
            base = path.rstrip("/")
            if rules.DCP in kinds and rules.DCP_METADATA in files:
                body = self._body(files[rules.DCP_METADATA], gen)
                if body is not None:
                    found.append(Found(path, *body, rules.DCP))
                    continue  # a DCP checkpoint directory: nothing more inside
            if rules.LIGHTNING in kinds:
                for n, child in files.items():
                    body = self._body(child, gen) if rules.is_lightning_file(n) else None
                    if body is not None:
                        found.append(Found(f"{base}/{n}", *body, rules.LIGHTNING))
            latest = None
            if rules.DEEPSPEED in kinds and rules.DEEPSPEED_LATEST in files:
                latest = self._body(files[rules.DEEPSPEED_LATEST], gen)
            for n, child, is_dir in children:
                if not is_dir:
                    continue
                child_path = f"{base}/{n}"
                if checkpoint_step(n) is not None:
                    state = self._state_file(child, gen) if rules.TRAINER in kinds else None
                    if state is not None:
                        found.append(Found(child_path, *state))
                    continue
                if latest is not None:
                    visited += 1
                    body = self._first_file(child, gen)
                    if body is not None:
                        found.append(Found(child_path, *body, rules.DEEPSPEED, latest))
                if depth + 1 < MAX_DEPTH:
                    stack.append((child, child_path, depth + 1))
        return sorted(found, key=lambda f: f.path)
