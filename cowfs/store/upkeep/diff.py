"""Compare the tree as of two generations: what was added, removed and changed.

A file is changed when its bytes (its chunk sequence), its type, its symlink
target or its permission bits differ; a file written again with the same bytes
is unchanged. `shared_bytes` of a file on the B side counts the bytes of its
chunks that the A tree already holds somewhere (so they cost nothing new).
"""
from __future__ import annotations

import sqlite3
import stat
from dataclasses import dataclass, field

from ..catalog import namespace as ns
from ..catalog.schema import ROOT_INO

ADDED = "added"
REMOVED = "removed"
CHANGED = "changed"


@dataclass(frozen=True)
class Node:
    ino: int
    mode: int
    size: int
    content_id: int | None
    target: bytes | None

    @property
    def kind(self) -> str:
        return ns.kind_name(self.mode)


@dataclass(frozen=True)
class DiffEntry:
    change: str            # added, removed, changed
    path: str
    kind: str              # file, dir, symlink, fifo, socket, char, block (of the B side, or A for removed)
    size_a: int | None     # None when absent on that side
    size_b: int | None
    shared_bytes: int      # bytes of the B side already held by the A tree (0 for removed)


@dataclass
class DiffReport:
    gen_a: int
    gen_b: int
    entries: list[DiffEntry] = field(default_factory=list)
    unchanged: int = 0

    def count(self, change: str) -> int:
        return sum(e.change == change for e in self.entries)

    @property
    def new_bytes(self) -> int:
        """Bytes of added and changed files that the A tree did not hold."""
        return sum((e.size_b or 0) - e.shared_bytes for e in self.entries if e.change != REMOVED)


def tree(conn: sqlite3.Connection, gen: int) -> dict[str, Node]:
    """Every path under the root as of `gen` (the root itself excluded)."""
    children: dict[int, list[tuple[bytes, int]]] = {}
    for parent, name, ino in conn.execute(
        "SELECT parent, name, ino FROM dentries WHERE birth_gen<=? AND death_gen>?", (gen, gen)
    ):
        children.setdefault(parent, []).append((bytes(name), ino))
    nodes = {
        ino: Node(ino, mode, size, content_id, bytes(target) if target is not None else None)
        for ino, mode, size, content_id, target in conn.execute(
            "SELECT ino, mode, size, content_id, target FROM versions WHERE birth_gen<=? AND death_gen>?", (gen, gen)
        )
    }
    out: dict[str, Node] = {}
    stack = [(ROOT_INO, "")]
    while stack:
        ino, prefix = stack.pop()
        for name, child in children.get(ino, ()):
            node = nodes.get(child)
            if node is None:
                continue  # fsck's business: an entry without a version
            path = f"{prefix}/{name.decode(errors='replace')}"
            out[path] = node
            if stat.S_ISDIR(node.mode):
                stack.append((child, path))
    return out


class ChunkLists:
    """Chunk lists of bodies, loaded once each."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self._cache: dict[int, list[tuple[int, int | None]]] = {}

    def of(self, content_id: int | None) -> list[tuple[int, int | None]]:
        if content_id is None:
            return []
        got = self._cache.get(content_id)
        if got is None:
            got = self._cache[content_id] = [
                (length, cid) for length, cid in self.conn.execute(
                    "SELECT length, cid FROM extents WHERE content_id=? ORDER BY file_offset", (content_id,)
                )
            ]
        return got


def same_node(a: Node, b: Node, chunks: ChunkLists) -> bool:
    """Whether two nodes of a path are the same: type, permission bits, and for a file its
    size and chunk sequence, for a symlink its target."""
    if a.kind != b.kind or stat.S_IMODE(a.mode) != stat.S_IMODE(b.mode):
        return False
    if a.kind == "symlink":
        return a.target == b.target
    if a.kind == "dir":
        return True
    return a.size == b.size and (a.content_id == b.content_id or chunks.of(a.content_id) == chunks.of(b.content_id))


def compare(conn: sqlite3.Connection, gen_a: int, gen_b: int) -> DiffReport:
    a, b = tree(conn, gen_a), tree(conn, gen_b)
    chunks = ChunkLists(conn)
    held: set[int] = set()
    for node in a.values():
        if node.content_id is not None:
            held.update(cid for _, cid in chunks.of(node.content_id) if cid is not None)

    def shared(node: Node) -> int:
        return sum(length for length, cid in chunks.of(node.content_id) if cid is not None and cid in held)

    report = DiffReport(gen_a, gen_b)
    for path in sorted(set(a) | set(b)):
        na, nb = a.get(path), b.get(path)
        if na is None and nb is not None:
            report.entries.append(DiffEntry(ADDED, path, nb.kind, None, _size(nb), shared(nb)))
        elif nb is None and na is not None:
            report.entries.append(DiffEntry(REMOVED, path, na.kind, _size(na), None, 0))
        elif na is not None and nb is not None:
            if same_node(na, nb, chunks):
                report.unchanged += 1
            else:
                report.entries.append(DiffEntry(CHANGED, path, nb.kind, _size(na), _size(nb), shared(nb)))
    return report


def _size(node: Node) -> int:
    return 0 if node.kind == "dir" else node.size
