"""The union of several stores' trees as one catalog: the namespace a consumer of a whole
prefix serves (docs/design.md section 17, "One namespace for a job").

`MergedCatalog` keeps a catalog file in the engine's own schema (so `Replica` serves it as
it serves one store's catalog, with history, `cowfs watch` events and the read checks)
whose tree is, at every one of its generations, the union of the followed stores' trees:

* a path that exists in one store shows that store's entry;
* a directory that exists in several is one directory holding the union of their entries
  (its attributes are those of the winning one);
* where stores disagree on a path (two files, or a file and a directory), the **clash
  rule** picks one: the entry whose last change has the highest generation wins, and of
  equal generations the store whose UUID sorts last. A store's generations are a Lamport
  clock (its daemon moves its own past every generation a peer's notice names,
  fs/namespace_clock.py), so a store that saw another's change before making its own wins:
  the later commit wins by an order that no machine's clock decides. The losing version
  is still in its own store's history; the merged view shows it again once the winner goes.

A store's step (its catalog file brought from generation OLD to NEW, and what changed,
remote/changes.py) becomes one transaction of the merged file, one generation: each path
that names a changed entry or inode, at OLD or NEW, is looked up in every store again and
brought to its winner. So a step costs what changed (times the number of stores), never
what the stores hold. A new directory in the merged tree brings in its whole subtree.

The merged file's extra tables (names starting `replica_`, which the engine ignores):
  replica_ns_files(store, src_ino) -> ino, src_vid, src_content: the merged inode of a
      store's file, symlink or special node, and the source version it last copied
  replica_ns_contents(store, src_content) -> content_id: bodies copied (extents with their
      chunk rows, matched by hash; a chunk row keeps the pack location the store's file gave)
  replica_ns_stores(store) -> generation: each store's generation the tree reflects
"""
from __future__ import annotations

import sqlite3
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from ..store.catalog.db import Txn, create_catalog, one_transaction
from ..store.catalog.namespace import VERSION_COLS, VersionRow
from ..store.catalog.schema import KIND_DIR, KIND_FILE, KIND_SPECIAL, KIND_SYMLINK, LIVE, ROOT_INO
from .changes import Changes
from .source import PACKS_USED, point_chunks

NAMESPACE_UUID = "00000000-0000-0000-0000-000000000000"  # meta.store_uuid of a merged catalog
EXTRA = """
CREATE TABLE IF NOT EXISTS replica_ns_files (store TEXT NOT NULL, src_ino INTEGER NOT NULL, ino INTEGER NOT NULL,
  src_vid INTEGER NOT NULL, src_content INTEGER, PRIMARY KEY (store, src_ino)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS replica_ns_contents (store TEXT NOT NULL, src_content INTEGER NOT NULL,
  content_id INTEGER NOT NULL, PRIMARY KEY (store, src_content)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS replica_ns_stores (store TEXT PRIMARY KEY, generation INTEGER NOT NULL) WITHOUT ROWID;
"""
_DIR_FIELDS = ("mode", "uid", "gid", "mtime_ns", "ctime_ns", "atime_ns", "xattrs")


def kind_of(mode: int) -> int:
    if stat.S_ISDIR(mode):
        return KIND_DIR
    if stat.S_ISREG(mode):
        return KIND_FILE
    if stat.S_ISLNK(mode):
        return KIND_SYMLINK
    return KIND_SPECIAL


def join(head: bytes, name: bytes) -> bytes:
    return name if not head else head + b"/" + name


def split(path: bytes) -> tuple[bytes, bytes]:
    head, _, name = path.rpartition(b"/")
    return head, name


def _version(conn: sqlite3.Connection, ino: int, gen: int) -> VersionRow | None:
    row = conn.execute(f"SELECT {VERSION_COLS} FROM versions WHERE ino=? AND birth_gen<=? AND death_gen>?",
                       (ino, gen, gen)).fetchone()
    return None if row is None else VersionRow(*row)


def paths_at(conn: sqlite3.Connection, ino: int, gen: int) -> list[bytes]:
    """Every path (bytes, no leading '/', b"" for the root) naming `ino` at `gen`."""
    if ino == ROOT_INO:
        return [b""]
    out: list[bytes] = []
    for parent, name in conn.execute("SELECT parent, name FROM dentries WHERE ino=? AND birth_gen<=? AND death_gen>?",
                                     (ino, gen, gen)).fetchall():
        out.extend(join(head, bytes(name)) for head in paths_at(conn, int(parent), gen))
    return out


def tree_paths(conn: sqlite3.Connection, gen: int) -> list[bytes]:
    """Every path of the tree at `gen`, parents before children."""
    out: list[bytes] = [b""]
    stack = [(ROOT_INO, b"")]
    while stack:
        ino, head = stack.pop()
        for name, child in conn.execute("SELECT name, ino FROM dentries WHERE parent=? AND birth_gen<=? AND"
                                        " death_gen>?", (ino, gen, gen)).fetchall():
            path = join(head, bytes(name))
            out.append(path)
            row = _version(conn, int(child), gen)
            if row is not None and stat.S_ISDIR(row.mode):
                stack.append((int(child), path))
    return out


@dataclass
class Step:
    """One store's catalog file brought from generation `old` to `new`, and what changed
    (None: not known, every path of it is looked at)."""
    store: str
    catalog: Path
    old: int
    new: int
    changes: Changes | None


@dataclass
class Candidate:
    """A store's entry at a path: its inode, version, and the key the clash rule compares."""
    store: str
    conn: sqlite3.Connection
    gen: int
    ino: int
    row: VersionRow
    key: tuple[int, str]

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.row.mode)


def _candidate(store: str, conn: sqlite3.Connection, gen: int, path: bytes) -> Candidate | None:
    ino, born = ROOT_INO, 0
    for part in path.split(b"/") if path else []:
        row = conn.execute("SELECT ino, birth_gen FROM dentries WHERE parent=? AND name=? AND birth_gen<=? AND"
                           " death_gen>?", (ino, part, gen, gen)).fetchone()
        if row is None:
            return None
        parent = _version(conn, ino, gen)
        if parent is None or not stat.S_ISDIR(parent.mode):
            return None
        ino, born = int(row[0]), int(row[1])
    v = _version(conn, ino, gen)
    if v is None:
        return None
    return Candidate(store, conn, gen, ino, v, (max(born, v.birth_gen), store))


def entry_key(store: str, conn: sqlite3.Connection, gen: int, path: bytes) -> tuple[tuple[int, str], bool] | None:
    """The clash rule's key of `store`'s entry at `path` as of `gen`, and whether it is a
    directory; None if it has none there."""
    c = _candidate(store, conn, gen, path)
    return None if c is None else (c.key, c.is_dir)


class MergedCatalog:
    """The merged catalog file at `path` (created if absent) over stores' catalog files;
    `remote_db`: the consumer's remote.db, whose pack numbers the chunk rows use."""

    def __init__(self, path: Path, remote_db: Path) -> None:
        self.path = path
        if not path.exists():
            create_catalog(path, NAMESPACE_UUID)
        self.conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=60)
        self.conn.execute("PRAGMA busy_timeout = 60000")
        self.conn.execute("PRAGMA synchronous = OFF")  # a cache, built again at every mount: no fsync
        self.conn.executescript(EXTRA + f"CREATE TABLE IF NOT EXISTS {PACKS_USED} (id INTEGER PRIMARY KEY);")
        self.conn.execute("ATTACH DATABASE ? AS r", (str(remote_db),))
        self.sources: dict[str, Path] = {}  # store -> its catalog file, as set by the last step
        self._reading: list[tuple[str, sqlite3.Connection, int]] = []
        self._changes = Changes(0, 0)
        self._new_packs: set[int] = set()

    @property
    def generation(self) -> int:
        return int(self.conn.execute("SELECT value FROM meta WHERE key='generation'").fetchone()[0])

    def store_generations(self) -> dict[str, int]:
        return {str(s): int(g) for s, g in self.conn.execute("SELECT store, generation FROM replica_ns_stores")}

    # -- steps -------------------------------------------------------------------------

    def step(self, store: str, catalog: Path, old: int, new: int, changes: Changes | None) -> Changes:
        """Store `store`'s catalog file is now `catalog`, at generation `new`, and `changes`
        says what changed since `old` (None: anything may have: every path it held at `old`,
        in its previous file, and holds at `new` is looked at). One merged transaction;
        returns what changed in the merged tree."""
        return self.steps([Step(store, catalog, old, new, changes)])

    def steps(self, steps: "list[Step]") -> Changes:
        """Several stores' steps merged as one transaction, one merged generation."""
        previous = {st.store: self.sources.get(st.store) for st in steps}
        for st in steps:
            self.sources[st.store] = st.catalog
        paths: set[bytes] = set()
        with _Sources(self.sources, {st.store: st.new for st in steps}) as reading:
            conns = {s: c for s, c, _ in reading}
            for st in steps:
                conn = conns[st.store]
                before = previous[st.store]
                if st.changes is None:
                    paths.update(tree_paths(conn, st.new))
                    if before is not None and before != st.catalog and before.exists():
                        old_conn = sqlite3.connect(f"file:{before}?mode=ro", uri=True)
                        try:
                            paths.update(tree_paths(old_conn, st.old))
                        finally:
                            old_conn.close()
                else:
                    for gen in {st.old, st.new}:
                        for parent, name in st.changes.entries:
                            paths.update(join(head, name) for head in paths_at(conn, parent, gen))
                        for ino in st.changes.inos:
                            paths.update(paths_at(conn, ino, gen))
            return self._apply(reading, paths, {st.store: st.new for st in steps}, "merge")

    def resync(self) -> Changes:
        """Every path of every store and of the merged tree looked at again (after a step
        failed half way: its store's file moved on, the merged transaction did not)."""
        with self._open_sources() as reading:
            paths: set[bytes] = set()
            for _, conn, gen in reading:
                paths.update(tree_paths(conn, gen))
            paths.update(tree_paths(self.conn, self.generation))
            return self._apply(reading, paths, {s: g for s, _, g in reading}, "resync")

    def forget(self, store: str) -> Changes:
        """A store gone from the bucket: its entries leave the merged tree."""
        self.sources.pop(store, None)
        with self._open_sources() as reading:
            paths = set(tree_paths(self.conn, self.generation))
            changes = self._apply(reading, paths, {}, "forget")
        self.conn.execute("DELETE FROM replica_ns_stores WHERE store=?", (store,))
        return changes

    def winners(self, paths: Iterable[bytes]) -> dict[bytes, tuple[tuple[int, str], bool]]:
        """The clash rule's key of the winning store's entry at each path, and whether it is a
        directory (paths no store holds are left out). The caller keeps steps away meanwhile."""
        out: dict[bytes, tuple[tuple[int, str], bool]] = {}
        with self._open_sources() as reading:
            for path in paths:
                cands = [c for c in (_candidate(s, conn, g, path) for s, conn, g in reading) if c is not None]
                if cands:
                    win = max(cands, key=lambda c: c.key)
                    out[path] = (win.key, win.is_dir)
        return out

    def _open_sources(self) -> "_Sources":
        return _Sources(self.sources)

    def _apply(self, reading: list[tuple[str, sqlite3.Connection, int]], paths: Iterable[bytes],
               gens: dict[str, int], op: str) -> Changes:
        def fn(txn: Txn) -> Changes:
            gen = txn.gen
            self._changes = Changes(gen - 1, gen)
            self._new_packs = set()
            for path in sorted(paths, key=lambda p: (p.count(b"/") if p else -1, p)):
                self._sync(txn, path)
            self.conn.executemany("INSERT OR REPLACE INTO replica_ns_stores VALUES (?, ?)", sorted(gens.items()))
            self._repoint()
            return self._changes

        self._reading = reading
        try:
            return one_transaction(self.conn, fn, op)
        finally:
            self._reading = []

    def _repoint(self) -> None:
        """Chunk rows in packs remote.db has forgotten (deleted, or damaged and replaced since)
        pointed at a pack holding them now, and the packs the rows use noted (as a store's
        catalog file does, source.py): a query by pack, not over every row."""
        conn = self.conn
        conn.executemany(f"INSERT OR IGNORE INTO main.{PACKS_USED} VALUES (?)", [(s,) for s in self._new_packs if s])
        gone = [int(r[0]) for r in conn.execute(f"SELECT id FROM main.{PACKS_USED} WHERE id NOT IN"
                                                " (SELECT id FROM r.packs)")]
        if not gone:
            return
        marks = ",".join("?" * len(gone))
        moved = [int(r[0]) for r in conn.execute(f"SELECT cid FROM main.chunks WHERE seg_id IN ({marks})", gone)]
        conn.execute(f"DELETE FROM main.{PACKS_USED} WHERE id IN ({marks})", gone)
        for i in range(0, len(moved), 500):
            part = moved[i:i + 500]
            point_chunks(conn, f"cid IN ({','.join(map(str, part))})")
            conn.execute(f"INSERT OR IGNORE INTO main.{PACKS_USED} SELECT DISTINCT seg_id FROM main.chunks"
                         f" WHERE cid IN ({','.join(map(str, part))}) AND seg_id != 0")

    # -- one path ----------------------------------------------------------------------

    def _winner(self, path: bytes) -> tuple[Candidate | None, list[Candidate]]:
        cands = [c for c in (_candidate(s, conn, g, path) for s, conn, g in self._reading) if c is not None]
        return (max(cands, key=lambda c: c.key) if cands else None), cands

    def _live_child(self, parent: int, name: bytes) -> tuple[int, VersionRow | None] | None:
        row = self.conn.execute("SELECT ino FROM dentries WHERE parent=? AND name=? AND death_gen=?",
                                (parent, name, LIVE)).fetchone()
        return None if row is None else (int(row[0]), _version(self.conn, int(row[0]), LIVE - 1))

    def _dir_at(self, txn: Txn, path: bytes) -> int | None:
        """The merged directory at `path`, brought there first if it is missing; None when
        the merged tree shows no directory there (a file won the path, or nothing is there)."""
        if not path:
            return ROOT_INO
        head, name = split(path)
        parent = self._dir_at(txn, head)
        if parent is None:
            return None
        child = self._live_child(parent, name)
        if child is None:
            self._sync(txn, path)
            child = self._live_child(parent, name)
        if child is None or child[1] is None or not stat.S_ISDIR(child[1].mode):
            return None
        return child[0]

    def _sync(self, txn: Txn, path: bytes) -> None:
        """Bring the merged entry at `path` to its winner among the stores."""
        win, cands = self._winner(path)
        if not path:
            if win is not None and win.is_dir:
                self._dir_attrs(txn, ROOT_INO, win)
            return
        head, name = split(path)
        parent = self._dir_at(txn, head)
        if parent is None:
            return
        cur = self._live_child(parent, name)
        if win is None:
            if cur is not None:
                self._remove(txn, parent, name, cur[0])
            return
        if win.is_dir:
            if cur is not None and cur[1] is not None and stat.S_ISDIR(cur[1].mode):
                self._dir_attrs(txn, cur[0], win)
                return
            if cur is not None:
                self._remove(txn, parent, name, cur[0])
            ino = self._new_inode(txn, KIND_DIR)
            self._insert_version(txn, ino, win.row, content_id=None, nlink=1)
            self._link(txn, parent, name, ino)
            names: set[bytes] = set()
            for c in cands:
                if c.is_dir:
                    names.update(bytes(r[0]) for r in c.conn.execute(
                        "SELECT name FROM dentries WHERE parent=? AND birth_gen<=? AND death_gen>?",
                        (c.ino, c.gen, c.gen)))
            for child in sorted(names):
                self._sync(txn, join(path, child))
            return
        ino = self._file(txn, win)
        if cur is not None and cur[0] == ino:
            return
        if cur is not None:
            self._remove(txn, parent, name, cur[0])
        self._link(txn, parent, name, ino)

    # -- rows of the merged tree ------------------------------------------------------------

    def _new_inode(self, txn: Txn, kind: int) -> int:
        cur = txn.execute("INSERT INTO inodes(kind, birth_gen) VALUES (?, ?)", (kind, txn.gen))
        assert cur.lastrowid is not None
        return int(cur.lastrowid)

    def _insert_version(self, txn: Txn, ino: int, src: VersionRow, content_id: int | None, nlink: int) -> None:
        txn.execute(
            "INSERT INTO versions(ino, birth_gen, death_gen, size, mode, uid, gid, mtime_ns, ctime_ns, content_id,"
            " target, data_gen, nlink, atime_ns, rdev, xattrs) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (ino, txn.gen, LIVE, src.size, src.mode, src.uid, src.gid, src.mtime_ns, src.ctime_ns, content_id,
             src.target, txn.gen, nlink, src.atime_ns, src.rdev, src.xattrs))
        self._changes.inos.add(ino)

    def _end_version(self, txn: Txn, ino: int) -> None:
        if txn.execute("UPDATE versions SET death_gen=? WHERE ino=? AND death_gen=?", (txn.gen, ino, LIVE)).rowcount:
            self._changes.inos.add(ino)

    def _link(self, txn: Txn, parent: int, name: bytes, ino: int) -> None:
        txn.execute("INSERT INTO dentries(parent, name, ino, birth_gen, death_gen) VALUES (?,?,?,?,?)",
                    (parent, name, ino, txn.gen, LIVE))
        self._changes.entries.add((parent, name))

    def _remove(self, txn: Txn, parent: int, name: bytes, ino: int) -> None:
        """End the entry, and the inode with its last entry (a directory: its subtree first)."""
        row = _version(self.conn, ino, LIVE - 1)
        if row is not None and stat.S_ISDIR(row.mode):
            for child_name, child in txn.execute("SELECT name, ino FROM dentries WHERE parent=? AND death_gen=?",
                                                 (ino, LIVE)).fetchall():
                self._remove(txn, ino, bytes(child_name), int(child))
        txn.execute("UPDATE dentries SET death_gen=? WHERE parent=? AND name=? AND death_gen=?",
                    (txn.gen, parent, name, LIVE))
        self._changes.entries.add((parent, name))
        if not txn.execute("SELECT 1 FROM dentries WHERE ino=? AND death_gen=?", (ino, LIVE)).fetchone():
            self._end_version(txn, ino)

    def _dir_attrs(self, txn: Txn, ino: int, win: Candidate) -> None:
        cur = _version(self.conn, ino, LIVE - 1)
        if cur is None:
            self._insert_version(txn, ino, win.row, None, 1)
        elif any(getattr(cur, f) != getattr(win.row, f) for f in _DIR_FIELDS):
            self._end_version(txn, ino)
            self._insert_version(txn, ino, win.row, None, 1)

    def _file(self, txn: Txn, win: Candidate) -> int:
        """The merged inode of the winner's file (symlink, node), holding its version."""
        row = txn.execute("SELECT ino, src_vid, src_content FROM replica_ns_files WHERE store=? AND src_ino=?",
                          (win.store, win.ino)).fetchone()
        if row is None:
            ino = self._new_inode(txn, kind_of(win.row.mode))
        else:
            ino = int(row[0])
            live = _version(self.conn, ino, LIVE - 1)
            if live is not None and (int(row[1]), row[2]) == (win.row.vid, win.row.content_id):
                return ino
            if live is not None:
                self._end_version(txn, ino)
        content = None if win.row.content_id is None else self._content(txn, win)
        self._insert_version(txn, ino, win.row, content, win.row.nlink)
        txn.execute("INSERT OR REPLACE INTO replica_ns_files VALUES (?,?,?,?,?)",
                    (win.store, win.ino, ino, win.row.vid, win.row.content_id))
        return ino

    def _content(self, txn: Txn, win: Candidate) -> int:
        """The merged body of the winner's version: copied once per store and body, with
        the chunk rows its extents use (and the delta bases they decode from) by hash."""
        src_content = win.row.content_id
        row = txn.execute("SELECT content_id FROM replica_ns_contents WHERE store=? AND src_content=?",
                          (win.store, src_content)).fetchone()
        if row is not None:
            return int(row[0])
        src = win.conn
        size, compacted = src.execute("SELECT size, compacted FROM contents WHERE content_id=?",
                                      (src_content,)).fetchone()
        cur = txn.execute("INSERT INTO contents(size, compacted) VALUES (?, ?)", (size, compacted))
        assert cur.lastrowid is not None
        content_id = int(cur.lastrowid)
        cids: dict[int, int] = {}
        extents = src.execute("SELECT file_offset, length, cid FROM extents WHERE content_id=? ORDER BY file_offset",
                              (src_content,)).fetchall()
        rows = []
        for offset, length, cid in extents:
            rows.append((content_id, offset, length, None if cid is None else self._chunk(txn, src, int(cid), cids)))
        txn.conn.executemany("INSERT INTO extents(content_id, file_offset, length, cid) VALUES (?,?,?,?)", rows)
        txn.execute("INSERT INTO replica_ns_contents VALUES (?,?,?)", (win.store, src_content, content_id))
        return content_id

    def _chunk(self, txn: Txn, src: sqlite3.Connection, cid: int, done: dict[int, int]) -> int:
        """The merged chunk row of the source's chunk `cid` (its base first), by hash."""
        if cid in done:
            return done[cid]
        h, seg, off, stored, raw, codec, base = src.execute(
            "SELECT hash, seg_id, offset, stored_len, raw_len, codec, base_cid FROM chunks WHERE cid=?",
            (cid,)).fetchone()
        got = txn.execute("SELECT cid FROM chunks WHERE hash=?", (h,)).fetchone()
        if got is None:
            base_cid = None if base is None else self._chunk(txn, src, int(base), done)
            cur = txn.execute("INSERT INTO chunks(hash, seg_id, offset, stored_len, raw_len, first_gen, codec,"
                              " base_cid) VALUES (?,?,?,?,?,?,?,?)", (h, seg, off, stored, raw, txn.gen, codec, base_cid))
            assert cur.lastrowid is not None
            done[cid] = int(cur.lastrowid)
            self._new_packs.add(int(seg))
        else:
            done[cid] = int(got[0])
        return done[cid]

    def close(self) -> None:
        self.conn.close()


class _Sources:
    """Read connections to each store's catalog file, at the generation it holds (or the one
    `at` names for it: a step's own, which a pin may take below the file's), for one merge (a
    context: closed at its end)."""

    def __init__(self, sources: dict[str, Path], at: dict[str, int] | None = None) -> None:
        self.sources = dict(sources)
        self.at = at or {}
        self.reading: list[tuple[str, sqlite3.Connection, int]] = []

    def __enter__(self) -> list[tuple[str, sqlite3.Connection, int]]:
        for store in sorted(self.sources):
            conn = sqlite3.connect(f"file:{self.sources[store]}?mode=ro", uri=True, check_same_thread=False)
            conn.execute("BEGIN")  # one snapshot of the file for the whole merge
            gen = int(conn.execute("SELECT value FROM meta WHERE key='generation'").fetchone()[0])
            self.reading.append((store, conn, min(gen, self.at.get(store, gen))))
        return self.reading

    def __exit__(self, *exc: object) -> None:
        for _, conn, _ in self.reading:
            conn.close()


def fresh(path: Path, remote_db: Path) -> MergedCatalog:
    """A new, empty merged catalog at `path` (any file there before, and its WAL, removed)."""
    for f in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        f.unlink(missing_ok=True)
    return MergedCatalog(path, remote_db)

