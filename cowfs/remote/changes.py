"""What a consumer tells the kernel and `cowfs watch` when it moves from generation OLD to
NEW (docs/design.md section 17, "Consumers"), found from the rows that changed, not from
the whole tree: a delta holds the rows, as of NEW, of every key changed after OLD, so the
inodes and entries with a version or name born or ended in (OLD, NEW] are among its rows.
Only a step from a whole catalog (a consumer catching up after it was away) scans the
catalog's `versions` and `dentries` instead.

The events are those a comparison of the two trees (`Store.diff`) gives, file by file: a
path that exists at NEW and names a file new there or with other bytes, type or
permission bits is a `version`; a path that existed at OLD and not at NEW is a `remove`
(every path under a directory so gone too). They are computed from the changed entries and
inodes, and the subtrees of directories among them, so their cost is that of the change.
"""
from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass, field

from ..errors import NotFound
from ..store.catalog import namespace as ns
from ..store.catalog.events import REMOVE, VERSION, Event
from ..store.catalog.namespace import Attr
from ..store.catalog.schema import ROOT_INO
from ..store.upkeep.diff import ChunkLists, Node, same_node

_IN = "(birth_gen > ?1 AND birth_gen <= ?2) OR (death_gen > ?1 AND death_gen <= ?2)"


@dataclass
class Changes:
    """Inodes with a version, and entries (parent, name), born or ended in (old, new] (from a
    delta, also those whose rows it deletes)."""
    old: int
    new: int
    inos: set[int] = field(default_factory=set)
    entries: set[tuple[int, bytes]] = field(default_factory=set)

    def add_rows(self, conn: sqlite3.Connection, schema: str, old: int, new: int) -> None:
        """Those of the `versions` and `dentries` tables of `schema` (a delta ATTACHed as `d`,
        or `main` for a scan of a whole catalog), for the generations (old, new]."""
        self.inos.update(r[0] for r in conn.execute(f"SELECT ino FROM {schema}.versions WHERE {_IN}", (old, new)))
        self.entries.update((r[0], bytes(r[1])) for r in conn.execute(
            f"SELECT parent, name FROM {schema}.dentries WHERE {_IN}", (old, new)))
        if schema != "main":  # a delta also lists the keys of rows deleted since (history expired, gc):
            # the kernel may still cache such an entry or inode, so they are dropped too
            self.entries.update((r[0], bytes(r[1])) for r in conn.execute(
                f"SELECT k1, k2 FROM {schema}.delta_keys WHERE tbl = 'dentries'"))
            self.inos.update(r[0] for r in conn.execute(f"SELECT k1 FROM {schema}.delta_keys WHERE tbl = 'inodes'"))


def scan(conn: sqlite3.Connection, old: int, new: int) -> Changes:
    """The changes between two generations of the catalog open on `conn`, by a scan."""
    changes = Changes(old, new)
    changes.add_rows(conn, "main", old, new)
    return changes


def _entry_path(conn: sqlite3.Connection, parent: int, name: bytes, gen: int) -> str | None:
    heads = ["/"] if parent == ROOT_INO else ns.paths_of(conn, parent, gen)
    return f"{heads[0].rstrip('/')}/{name.decode(errors='replace')}" if heads else None


def _subtree(conn: sqlite3.Connection, path: str, attr: Attr, gen: int) -> list[tuple[str, Attr]]:
    """`path` and, for a directory, every path under it, as of `gen`."""
    out = [(path, attr)]
    stack = [(path, attr)]
    while stack:
        head, node = stack.pop()
        if not node.is_dir:
            continue
        for name, child in ns.readdir(conn, node.ino, gen):
            item = (f"{head.rstrip('/')}/{name.decode(errors='replace')}", child)
            out.append(item)
            stack.append(item)
    return out


def _looked_up(conn: sqlite3.Connection, parent: int, name: bytes, gen: int) -> Attr | None:
    try:
        return ns.lookup(conn, parent, name, gen)
    except NotFound:
        return None


def _node(a: Attr) -> Node:
    return Node(a.ino, a.mode, a.size, a.content_id, None)  # (the events name files only: no targets)


def events(conn: sqlite3.Connection, changes: Changes) -> list[Event]:
    """The watch events of `changes`, read from a catalog that holds both generations (the
    consumer's, inside one read transaction), ordered by path."""
    old, new = changes.old, changes.new
    before: dict[str, Attr] = {}  # the paths the change touched, as of old and as of new
    after: dict[str, Attr] = {}
    for parent, name in changes.entries:
        then, now = _looked_up(conn, parent, name, old), _looked_up(conn, parent, name, new)
        if then is not None and (now is None or now.ino != then.ino):
            path = _entry_path(conn, parent, name, old)
            if path is not None:
                before.update(_subtree(conn, path, then, old))
        if now is not None and (then is None or now.ino != then.ino):
            path = _entry_path(conn, parent, name, new)
            if path is not None:
                after.update(_subtree(conn, path, now, new))
    # A path whose entry did not change names the same inode at both generations: any other
    # path the change reaches is under a changed entry, walked above.
    for ino in changes.inos:
        try:
            now = ns.getattr_(conn, ino, new)
        except NotFound:
            continue
        try:
            then: Attr | None = ns.getattr_(conn, ino, old)
        except NotFound:
            then = None
        if now.is_dir or (then is not None and then.vid == now.vid):
            continue
        for path in ns.paths_of(conn, ino, new):
            if path not in after:
                after[path] = now
                if then is not None:
                    before.setdefault(path, then)
    chunks = ChunkLists(conn)
    stamp = time.time_ns()
    out: list[Event] = []
    for path in sorted(before.keys() | after.keys()):
        b, a = before.get(path), after.get(path)
        if a is None:
            out.append(Event(REMOVE, new, stamp, path=path))
        elif a.is_file and (b is None or not same_node(_node(b), _node(a), chunks)):
            out.append(Event(VERSION, new, stamp, path=path, size=a.size))
    return out
