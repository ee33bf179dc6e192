"""Snapshots: named generations of the catalog. A snapshot pins every version and entry
alive at its generation; creating or deleting one is one transaction."""
from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from ..errors import Exists, InvalidArgument, NotFound
from .catalog import Txn


@dataclass(frozen=True)
class Snapshot:
    name: str
    gen: int
    created_ns: int


def validate_snapshot_name(name: str) -> None:
    if not name or "/" in name or "\0" in name or name[0] in "@." or len(name.encode()) > 255:
        raise InvalidArgument(f"invalid snapshot name {name!r} (no '/', must not start with '@' or '.')")


def create(txn: Txn, name: str) -> Snapshot:
    validate_snapshot_name(name)
    if txn.execute("SELECT 1 FROM snapshots WHERE name=?", (name,)).fetchone():
        raise Exists(f"snapshot {name!r} already exists")
    txn.execute("INSERT INTO snapshots VALUES (?,?,?)", (name, txn.gen, txn.now_ns))
    return Snapshot(name, txn.gen, txn.now_ns)


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
