"""Namespace queries and changes on the catalog, as of any generation.

Readers take a connection and a generation; writers take a Txn and change the
live tree (rows with death_gen = LIVE). Every change is one transaction.
"""
from __future__ import annotations

import sqlite3
import stat
from dataclasses import dataclass
from typing import NamedTuple

from ...errors import Exists, InvalidArgument, IsADirectory, NotADirectory, NotEmpty, NotFound, NotPermitted
from .db import Txn
from .schema import KIND_DIR, KIND_FILE, KIND_SPECIAL, KIND_SYMLINK, LIVE, ROOT_INO


class VersionRow(NamedTuple):
    """One row of the versions table, in VERSION_COLS order (see docs/format.md)."""

    vid: int
    ino: int
    birth_gen: int
    death_gen: int
    size: int
    mode: int
    uid: int
    gid: int
    mtime_ns: int
    ctime_ns: int
    content_id: int | None
    target: bytes | None
    data_gen: int
    nlink: int
    atime_ns: int
    rdev: int
    xattrs: bytes | None


VERSION_COLS = ", ".join(VersionRow._fields)
NAME_MAX = 255


@dataclass(frozen=True)
class Attr:
    """What stat() shows of one inode as of one generation."""

    ino: int
    mode: int
    size: int
    uid: int
    gid: int
    mtime_ns: int
    ctime_ns: int
    nlink: int
    vid: int
    birth_gen: int
    data_gen: int
    content_id: int | None
    atime_ns: int = 0
    rdev: int = 0

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.mode)

    @property
    def is_file(self) -> bool:
        return stat.S_ISREG(self.mode)

    @property
    def is_symlink(self) -> bool:
        return stat.S_ISLNK(self.mode)

    @property
    def kind(self) -> str:
        return kind_name(self.mode)


KIND_NAMES = {stat.S_IFREG: "file", stat.S_IFDIR: "dir", stat.S_IFLNK: "symlink", stat.S_IFIFO: "fifo",
              stat.S_IFSOCK: "socket", stat.S_IFCHR: "char", stat.S_IFBLK: "block"}


def kind_name(mode: int) -> str:
    """What `cowfs ls` and `diff` call an inode of this mode."""
    return KIND_NAMES.get(stat.S_IFMT(mode), "file")


def current_gen(conn: sqlite3.Connection) -> int:
    return int(conn.execute("SELECT value FROM meta WHERE key='generation'").fetchone()[0])


def check_name(name: bytes) -> None:
    if not name or b"/" in name or b"\0" in name or name in (b".", b".."):
        raise InvalidArgument(f"invalid name {name!r}")
    if len(name) > NAME_MAX:
        raise InvalidArgument(f"name too long ({len(name)} bytes)", errno=36)  # ENAMETOOLONG


def version_row(conn: sqlite3.Connection, ino: int, gen: int) -> VersionRow | None:
    row = conn.execute(
        f"SELECT {VERSION_COLS} FROM versions WHERE ino=? AND birth_gen<=? AND death_gen>?", (ino, gen, gen)
    ).fetchone()
    return None if row is None else VersionRow(*row)


def attr_from_row(conn: sqlite3.Connection, row: VersionRow, gen: int) -> Attr:
    return Attr(row.ino, row.mode, row.size, row.uid, row.gid, row.mtime_ns, row.ctime_ns, row.nlink, row.vid,
                row.birth_gen, row.data_gen, row.content_id, row.atime_ns, row.rdev)


def version_row_or_fail(conn: sqlite3.Connection, ino: int, gen: int) -> VersionRow:
    row = version_row(conn, ino, gen)
    if row is None:
        raise NotFound(f"inode {ino} does not exist")
    return row


def getattr_(conn: sqlite3.Connection, ino: int, gen: int) -> Attr:
    return attr_from_row(conn, version_row_or_fail(conn, ino, gen), gen)


def lookup(conn: sqlite3.Connection, parent: int, name: bytes, gen: int) -> Attr:
    if len(name) > NAME_MAX:
        raise InvalidArgument(f"name too long ({len(name)} bytes)", errno=36)  # ENAMETOOLONG
    row = conn.execute(
        "SELECT ino FROM dentries WHERE parent=? AND name=? AND birth_gen<=? AND death_gen>?",
        (parent, name, gen, gen),
    ).fetchone()
    if row is None:
        raise NotFound(f"{name.decode(errors='replace')}: no such file or directory")
    return getattr_(conn, row[0], gen)


def readdir(conn: sqlite3.Connection, ino: int, gen: int) -> list[tuple[bytes, Attr]]:
    d = getattr_(conn, ino, gen)
    if not d.is_dir:
        raise NotADirectory(f"inode {ino} is not a directory")
    rows = conn.execute(
        "SELECT name, ino FROM dentries WHERE parent=? AND birth_gen<=? AND death_gen>? ORDER BY name",
        (ino, gen, gen),
    ).fetchall()
    out = []
    for name, child in rows:
        row = version_row(conn, child, gen)
        if row is not None:  # no version at gen (fsck --repair dropped a damaged one): not there at gen
            out.append((bytes(name), attr_from_row(conn, row, gen)))
    return out


def readlink(conn: sqlite3.Connection, ino: int, gen: int) -> bytes:
    row = version_row(conn, ino, gen)
    if row is None:
        raise NotFound(f"inode {ino} does not exist")
    if not stat.S_ISLNK(row.mode):
        raise InvalidArgument("not a symbolic link")
    return bytes(row.target or b"")


def resolve(conn: sqlite3.Connection, path: str | bytes, gen: int) -> Attr:
    """Follow a '/'-separated path from the root (symlinks are not followed)."""
    raw = path.encode() if isinstance(path, str) else path
    attr = getattr_(conn, ROOT_INO, gen)
    for part in raw.split(b"/"):
        if not part or part == b".":
            continue
        if not attr.is_dir:
            raise NotADirectory(f"{raw.decode(errors='replace')}: not a directory")
        attr = lookup(conn, attr.ino, part, gen)
    return attr


def paths_of(conn: sqlite3.Connection, ino: int, gen: int | None = None) -> list[str]:
    """Every path that named `ino` (as of `gen`, or at any time if None)."""
    out: list[str] = []
    if ino == ROOT_INO:
        return ["/"]
    q = "SELECT parent, name, birth_gen, death_gen FROM dentries WHERE ino=?"
    for parent, name, birth, death in conn.execute(q, (ino,)).fetchall():
        if gen is not None and not (birth <= gen < death):
            continue
        at = gen if gen is not None else birth
        for head in paths_of(conn, parent, at) if parent != ROOT_INO else [""]:
            out.append(f"{head.rstrip('/')}/{bytes(name).decode(errors='replace')}")
    return sorted(set(out))


def inodes_ever_at(conn: sqlite3.Connection, path: str | bytes) -> list[int]:
    """Every inode that was named `path` at some generation (files written to a temp name and
    renamed over the path are different inodes with one history)."""
    raw = path.encode() if isinstance(path, str) else path
    cands = {ROOT_INO}
    for part in raw.split(b"/"):
        if not part or part == b".":
            continue
        q = "SELECT DISTINCT ino FROM dentries WHERE name=? AND parent IN (%s)" % ",".join("?" * len(cands))
        cands = {r[0] for r in conn.execute(q, (part, *cands))}
        if not cands:
            raise NotFound(f"{raw.decode(errors='replace')}: never existed (or its history was pruned)")
    return sorted(cands)


# -- changes to the live tree -----------------------------------------------------


def live_version(txn: Txn, ino: int) -> VersionRow:
    row = txn.execute(f"SELECT {VERSION_COLS} FROM versions WHERE ino=? AND death_gen=?", (ino, LIVE)).fetchone()
    if row is None:
        raise NotFound(f"inode {ino} does not exist")
    return VersionRow(*row)


def new_version(txn: Txn, old: VersionRow, **changes: object) -> int:
    """Replace the live version row `old` by a copy with `changes`; returns the new vid."""
    if old.birth_gen == txn.gen:  # born in this transaction: change it in place
        sets = ", ".join(f"{k}=?" for k in changes)
        txn.execute(f"UPDATE versions SET {sets} WHERE vid=?", (*changes.values(), old.vid))
        return int(old.vid)
    txn.execute("UPDATE versions SET death_gen=? WHERE vid=?", (txn.gen, old.vid))
    new = old._replace(**changes)._replace(vid=None, birth_gen=txn.gen, death_gen=LIVE)
    cur = txn.execute(f"INSERT INTO versions({VERSION_COLS}) VALUES ({','.join('?' * len(new))})", new)
    return int(cur.lastrowid)


def kill_inode(txn: Txn, ino: int) -> None:
    txn.execute("UPDATE versions SET death_gen=? WHERE ino=? AND death_gen=?", (txn.gen, ino, LIVE))


def touch(txn: Txn, ino: int, subdirs: int = 0) -> None:
    """A directory's entries changed: new mtime and ctime; `subdirs` directories were added
    to it (negative: removed), which its nlink follows."""
    old = live_version(txn, ino)
    new_version(txn, old, mtime_ns=txn.now_ns, ctime_ns=txn.now_ns, nlink=old.nlink + subdirs)


def live_child(txn: Txn, parent: int, name: bytes) -> int | None:
    row = txn.execute("SELECT ino FROM dentries WHERE parent=? AND name=? AND death_gen=?", (parent, name, LIVE)).fetchone()
    return None if row is None else int(row[0])


def _live_dir(txn: Txn, ino: int) -> VersionRow:
    row = live_version(txn, ino)
    if not stat.S_ISDIR(row.mode):
        raise NotADirectory(f"inode {ino} is not a directory")
    return row


def has_children(txn: Txn, ino: int) -> bool:
    return txn.execute("SELECT 1 FROM dentries WHERE parent=? AND death_gen=? LIMIT 1", (ino, LIVE)).fetchone() is not None


SPECIAL_TYPES = (stat.S_IFIFO, stat.S_IFSOCK, stat.S_IFCHR, stat.S_IFBLK)
_FILE_TYPES = {KIND_FILE: stat.S_IFREG, KIND_DIR: stat.S_IFDIR, KIND_SYMLINK: stat.S_IFLNK}


def make_node(txn: Txn, parent: int, name: bytes, kind: int, mode: int, uid: int, gid: int, target: bytes | None = None,
              rdev: int = 0) -> int:
    """A new inode named `name` in `parent`. KIND_SPECIAL: `mode` carries the type (fifo, socket,
    character or block device; `rdev` the device number); other kinds set it from `kind`. In a
    set-group-ID directory the new inode takes the directory's group, and a new directory its
    set-group-ID bit (as on ext4; a caller outside the group keeps the bit on a file: cowfs does
    not know the caller's groups)."""
    check_name(name)
    dir_row = _live_dir(txn, parent)
    if live_child(txn, parent, name) is not None:
        raise Exists(f"{name.decode(errors='replace')}: already exists")
    if kind == KIND_SPECIAL:
        ftype = stat.S_IFMT(mode)
        if ftype not in SPECIAL_TYPES:
            raise InvalidArgument(f"not a fifo, socket or device node (mode {mode:o})")
    else:
        ftype = _FILE_TYPES[kind]
    if not stat.S_ISCHR(ftype) and not stat.S_ISBLK(ftype):
        rdev = 0
    perms = mode & 0o7777
    if dir_row.mode & stat.S_ISGID:
        gid = dir_row.gid
        if kind == KIND_DIR:
            perms |= stat.S_ISGID
    ino = int(txn.execute("INSERT INTO inodes(kind, birth_gen) VALUES (?, ?)", (kind, txn.gen)).lastrowid)
    size = len(target) if target is not None else 0
    now = txn.now_ns
    txn.execute(
        f"INSERT INTO versions({VERSION_COLS}) VALUES (NULL,?,?,?,?,?,?,?,?,?,NULL,?,?,?,?,?,NULL)",
        (ino, txn.gen, LIVE, size, ftype | perms, uid, gid, now, now, target, txn.gen,
         2 if kind == KIND_DIR else 1, now, rdev),
    )
    txn.execute("INSERT INTO dentries VALUES (?,?,?,?,?)", (parent, name, ino, txn.gen, LIVE))
    touch(txn, parent, 1 if kind == KIND_DIR else 0)
    return ino


def _end_dentry(txn: Txn, parent: int, name: bytes) -> None:
    """End the live entry; one born in this same generation was never visible and is dropped."""
    txn.execute("DELETE FROM dentries WHERE parent=? AND name=? AND birth_gen=? AND death_gen=?", (parent, name, txn.gen, LIVE))
    txn.execute(
        "UPDATE dentries SET death_gen=? WHERE parent=? AND name=? AND death_gen=?", (txn.gen, parent, name, LIVE)
    )


def _kill_entry(txn: Txn, parent: int, name: bytes, ino: int) -> None:
    """End the entry; the inode goes with its last name (a file with other hard links keeps
    its versions and loses one from its nlink)."""
    _end_dentry(txn, parent, name)
    row = live_version(txn, ino)
    if row.nlink > 1 and not stat.S_ISDIR(row.mode):
        new_version(txn, row, nlink=row.nlink - 1, ctime_ns=txn.now_ns)
    else:
        kill_inode(txn, ino)


def link(txn: Txn, ino: int, new_parent: int, new_name: bytes) -> None:
    """A new name for an existing file or symlink (a hard link): the inode's versions are
    seen through every name; its nlink counts them."""
    check_name(new_name)
    _live_dir(txn, new_parent)
    row = live_version(txn, ino)
    if stat.S_ISDIR(row.mode):
        raise NotPermitted("hard links to directories are not allowed")
    if live_child(txn, new_parent, new_name) is not None:
        raise Exists(f"{new_name.decode(errors='replace')}: already exists")
    txn.execute("INSERT INTO dentries VALUES (?,?,?,?,?)", (new_parent, new_name, ino, txn.gen, LIVE))
    new_version(txn, row, nlink=row.nlink + 1, ctime_ns=txn.now_ns)
    touch(txn, new_parent)


def unlink(txn: Txn, parent: int, name: bytes) -> int:
    _live_dir(txn, parent)
    ino = live_child(txn, parent, name)
    if ino is None:
        raise NotFound(f"{name.decode(errors='replace')}: no such file or directory")
    if stat.S_ISDIR(live_version(txn, ino).mode):
        raise IsADirectory(f"{name.decode(errors='replace')}: is a directory")
    _kill_entry(txn, parent, name, ino)
    touch(txn, parent)
    return ino


def rmdir(txn: Txn, parent: int, name: bytes) -> int:
    _live_dir(txn, parent)
    ino = live_child(txn, parent, name)
    if ino is None:
        raise NotFound(f"{name.decode(errors='replace')}: no such file or directory")
    if not stat.S_ISDIR(live_version(txn, ino).mode):
        raise NotADirectory(f"{name.decode(errors='replace')}: not a directory")
    if has_children(txn, ino):
        raise NotEmpty(f"{name.decode(errors='replace')}: directory not empty")
    _kill_entry(txn, parent, name, ino)
    touch(txn, parent, -1)
    return ino


def _is_ancestor(txn: Txn, ancestor: int, ino: int) -> bool:
    while ino != ROOT_INO:
        if ino == ancestor:
            return True
        row = txn.execute("SELECT parent FROM dentries WHERE ino=? AND death_gen=?", (ino, LIVE)).fetchone()
        if row is None:
            return False
        ino = int(row[0])
    return ancestor == ROOT_INO


def rename(txn: Txn, parent: int, name: bytes, new_parent: int, new_name: bytes, noreplace: bool = False,
           open_for_writing: frozenset[int] = frozenset()) -> int | None:
    """Atomic rename; returns the inode it replaced, if any.

    Replace-via-rename of a file that is still being written (safetensors renames its temp
    file over the target before closing it): if the source is open for writing and has only
    its empty create-version committed, it takes over the replaced file's committed body, so
    until the writer's close commits the new bytes the name keeps showing the previous
    version, and a crash in between leaves the previous version, never an empty file."""
    check_name(new_name)
    _live_dir(txn, parent)
    _live_dir(txn, new_parent)
    ino = live_child(txn, parent, name)
    if ino is None:
        raise NotFound(f"{name.decode(errors='replace')}: no such file or directory")
    src_dir = stat.S_ISDIR(live_version(txn, ino).mode)
    if src_dir and _is_ancestor(txn, ino, new_parent):
        raise InvalidArgument("cannot move a directory into itself")
    old = live_child(txn, new_parent, new_name)
    if old == ino:
        return None
    if old is not None:
        if noreplace:
            raise Exists(f"{new_name.decode(errors='replace')}: already exists")
        dst_dir = stat.S_ISDIR(live_version(txn, old).mode)
        if src_dir and not dst_dir:
            raise NotADirectory(f"{new_name.decode(errors='replace')}: not a directory")
        if dst_dir and not src_dir:
            raise IsADirectory(f"{new_name.decode(errors='replace')}: is a directory")
        if dst_dir and has_children(txn, old):
            raise NotEmpty(f"{new_name.decode(errors='replace')}: directory not empty")
        if ino in open_for_writing and not src_dir:
            src, dst = live_version(txn, ino), live_version(txn, old)
            if src.size == 0 and src.content_id is None and stat.S_ISREG(dst.mode):
                new_version(txn, src, size=dst.size, content_id=dst.content_id, data_gen=dst.data_gen)
        _kill_entry(txn, new_parent, new_name, old)
    _end_dentry(txn, parent, name)
    txn.execute("INSERT INTO dentries VALUES (?,?,?,?,?)", (new_parent, new_name, ino, txn.gen, LIVE))
    new_version(txn, live_version(txn, ino), ctime_ns=txn.now_ns)  # as ext4: a rename changes the inode's ctime
    # subdirectories gained and lost: the moved directory, and a directory it replaced
    moved = 1 if src_dir else 0
    replaced = 1 if old is not None and src_dir else 0
    if new_parent != parent:
        touch(txn, parent, -moved)
        touch(txn, new_parent, moved - replaced)
    else:
        touch(txn, parent, -replaced)
    return old


def setattr_(txn: Txn, ino: int, mode: int | None, uid: int | None, gid: int | None, mtime_ns: int | None,
             atime_ns: int | None = None) -> None:
    old = live_version(txn, ino)
    changes: dict[str, object] = {"ctime_ns": txn.now_ns}
    if mode is not None:
        changes["mode"] = (old.mode & ~0o7777) | (mode & 0o7777)
    if uid is not None:
        changes["uid"] = uid
    if gid is not None:
        changes["gid"] = gid
    if mtime_ns is not None:
        changes["mtime_ns"] = mtime_ns
    if atime_ns is not None:
        changes["atime_ns"] = atime_ns
    new_version(txn, old, **changes)
