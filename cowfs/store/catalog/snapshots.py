"""Snapshots: named generations of the catalog. A snapshot pins every version and entry
alive at its generation; creating or deleting one is one transaction. A snapshot usually
names the generation its own transaction takes; one may instead name an earlier
generation (the daemon's checkpoint snapshots name the commit that completed the
checkpoint) as long as no change since has dropped history (expire, repair)."""
from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from ...errors import Exists, HistoryDropped, InvalidArgument, NotFound
from .db import Txn


@dataclass(frozen=True)
class Snapshot:
    name: str
    gen: int
    created_ns: int


def validate_snapshot_name(name: str) -> None:
    if not name or "/" in name or "\0" in name or name[0] in "@." or len(name.encode()) > 255:
        raise InvalidArgument(f"invalid snapshot name {name!r} (no '/', must not start with '@' or '.')")


DROPPING_OPS = ("expire", "repair")  # changes that delete versions or entries of past generations


def create(txn: Txn, name: str, gen: int | None = None) -> Snapshot:
    """A snapshot of the tree as of now, or as of the earlier generation `gen`."""
    validate_snapshot_name(name)
    if txn.execute("SELECT 1 FROM snapshots WHERE name=?", (name,)).fetchone():
        raise Exists(f"snapshot {name!r} already exists")
    if gen is not None:
        if not 1 <= gen < txn.gen:
            raise InvalidArgument(f"generation {gen} is not an earlier generation (the next one is {txn.gen})")
        dropped = txn.execute(
            "SELECT gen, op FROM generations WHERE gen > ? AND op IN (%s) ORDER BY gen LIMIT 1"
            % ",".join("?" * len(DROPPING_OPS)), (gen, *DROPPING_OPS)).fetchone()
        if dropped is not None:
            raise HistoryDropped(f"generation {gen} can no longer be snapshotted: {dropped[1]} at generation "
                                 f"{dropped[0]} dropped history")
    pinned = txn.gen if gen is None else gen  # txn.gen: a change to the catalog in any case
    txn.execute("INSERT INTO snapshots VALUES (?,?,?)", (name, pinned, txn.now_ns))
    return Snapshot(name, pinned, txn.now_ns)


def delete(txn: Txn, name: str) -> None:
    if txn.execute("DELETE FROM snapshots WHERE name=?", (name,)).rowcount == 0:
        raise NotFound(f"no snapshot named {name!r}")
    txn.gen  # a change to the catalog: bump the generation


def listing(conn: sqlite3.Connection) -> list[Snapshot]:
    rows = conn.execute("SELECT name, gen, created_ns FROM snapshots ORDER BY gen, name").fetchall()
    return [Snapshot(*r) for r in rows]


def get(conn: sqlite3.Connection, name: str) -> Snapshot:
    row = conn.execute("SELECT name, gen, created_ns FROM snapshots WHERE name=?", (name,)).fetchone()
    if row is None:
        raise NotFound(f"no snapshot named {name!r}")
    return Snapshot(*row)
