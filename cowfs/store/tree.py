"""Changes to the tree (create, mkdir, symlink, mknod, link, unlink, rmdir, rename, setattr,
setxattr, removexattr): one
catalog transaction each (namespace.py), with the events that name them. A part of Store."""
from __future__ import annotations

import os
from concurrent.futures import Future
from dataclasses import replace
from typing import TYPE_CHECKING, Callable, TypeVar

from ..errors import InvalidArgument, IsADirectory
from .catalog import events as ev
from .catalog import namespace as ns
from .catalog import xattrs
from .catalog.db import Catalog, Txn
from .catalog.events import Event
from .catalog.namespace import Attr
from .catalog.schema import KIND_DIR, KIND_FILE, KIND_SPECIAL, KIND_SYMLINK
from .data.commit import commit_version, path_in, version_events

if TYPE_CHECKING:
    from .data.content import Extent
    from .data.session import SessionHandle, WriteSession
    from .log.log import Log

T = TypeVar("T")


def _make_node(parent: int, name: bytes, kind: int, mode: int, uid: int, gid: int, target: bytes | None,
               rdev: int) -> Callable[[Txn], Attr]:
    """The change that makes a node and returns its attributes."""

    def fn(txn: Txn) -> Attr:
        ino = ns.make_node(txn, parent, name, kind, mode, uid, gid, target, rdev)
        return ns.getattr_(txn.conn, ino, txn.gen)

    return fn


class TreeChanges:
    """The tree-changing methods of Store (which provides what is declared here)."""

    if TYPE_CHECKING:
        _sessions: dict[int, WriteSession]
        capabilities_stored: bool
        catalog: Catalog
        log: Log

        def _change(self, op: str, fn: Callable[[Txn], T], describe: Callable[[Txn, T], list[Event]] | None = None,
                    durable: bool = True) -> T: ...

        def getattr(self, ino: int, gen: int | None = None) -> Attr: ...

        def open_session(self, ino: int) -> SessionHandle: ...

        def _new_session(self, ino: int, content_id: int | None, extents: list[Extent], size: int,
                         commit_fn: Callable[[WriteSession, list[Extent]], tuple[Attr | None, list[Extent]]] | None = None
                         ) -> WriteSession: ...

    def _ids(self, uid: int | None, gid: int | None) -> tuple[int, int]:
        return (os.getuid() if uid is None else uid, os.getgid() if gid is None else gid)

    def _make(self, op: str, parent: int, name: bytes, kind: int, mode: int, uid: int | None, gid: int | None,
              target: bytes | None = None, durable: bool = True, rdev: int = 0) -> Attr:
        u, g = self._ids(uid, gid)
        return self._change(op, _make_node(parent, name, kind, mode, u, g, target, rdev), durable=durable)

    def create(self, parent: int, name: bytes, mode: int = 0o644, uid: int | None = None, gid: int | None = None, durable: bool = True) -> Attr:
        """A new empty regular file; not `durable`: see Catalog.write (the file's first version makes it durable)."""
        return self._make("create", parent, name, KIND_FILE, mode, uid, gid, durable=durable)

    def create_filled(self, parent: int, name: bytes, fill: Callable[["WriteSession"], None], mode: int = 0o644,
                      uid: int | None = None, gid: int | None = None) -> Attr:
        """A new regular file made by its first version: `fill` writes the bytes into a
        session of a file not made yet, and one durable transaction makes the file and commits
        them, so no crash leaves the file without them (a copy-up of another node's file,
        docs/design.md section 17). Exists if the name is taken by then, and then, as after a
        failure of `fill`, nothing is made (what was written is garbage for gc)."""
        u, g = self._ids(uid, gid)
        make = _make_node(parent, name, KIND_FILE, mode, u, g, None, 0)

        def commit(session: "WriteSession", extents: list[Extent]) -> tuple[Attr | None, list[Extent]]:
            self.log.sync()  # the data records first, as every commit

            def fn(txn: Txn) -> tuple[Attr | None, list[Extent]]:
                made = make(txn)
                return commit_version(txn, made.ino, session.size, session.mtime_ns, extents)

            return self._change("create", fn, lambda t, r: version_events(t, r[0]))

        session = self._new_session(0, None, [], 0, commit)
        try:
            fill(session)
            attr = session.commit() if session.dirty else self.create(parent, name, mode, u, g)  # (no bytes)
        finally:
            session.close()
        assert attr is not None
        return attr

    def create_submit(self, parent: int, name: bytes, mode: int, uid: int, gid: int) -> "Future[Attr]":
        """`create(..., durable=False)` queued for the catalog's writer thread without waiting
        (for the FUSE thread: `catalog.outcome(future)` once it is done). Creates have no
        events (a file's first version has them), so this is the whole change."""
        return self.catalog.submit(_make_node(parent, name, KIND_FILE, mode, uid, gid, None, 0), "create", durable=False)

    def mkdir(self, parent: int, name: bytes, mode: int = 0o755, uid: int | None = None, gid: int | None = None) -> Attr:
        return self._make("mkdir", parent, name, KIND_DIR, mode, uid, gid)

    def symlink(self, parent: int, name: bytes, target: bytes, uid: int | None = None, gid: int | None = None) -> Attr:
        if not target or b"\0" in target:
            raise InvalidArgument("invalid symlink target")
        return self._make("symlink", parent, name, KIND_SYMLINK, 0o777, uid, gid, target)

    def mknod(self, parent: int, name: bytes, mode: int, rdev: int = 0, uid: int | None = None, gid: int | None = None) -> Attr:
        """A fifo, socket or device node (`mode` carries its type): kept as metadata only, cowfs
        serves no I/O on it (the kernel does, for fifos; device nodes need a mount with dev)."""
        return self._make("mknod", parent, name, KIND_SPECIAL, mode, uid, gid, rdev=rdev)

    def link(self, ino: int, new_parent: int, new_name: bytes) -> Attr:
        """A hard link: `new_name` in `new_parent` names file (or symlink) `ino` too."""

        def fn(txn: Txn) -> Attr:
            ns.link(txn, ino, new_parent, new_name)
            return ns.getattr_(txn.conn, ino, txn.gen)

        def describe(txn: Txn, attr: Attr) -> list[Event]:
            return [Event(ev.LINK, txn.gen, txn.now_ns, path_in(txn, new_parent, new_name),
                          size=attr.size if attr.is_file else None)]

        return self._with_session_size(self._change("link", fn, describe))

    def unlink(self, parent: int, name: bytes) -> int:
        return self._change("unlink", lambda t: ns.unlink(t, parent, name),
                            lambda t, _: [Event(ev.REMOVE, t.gen, t.now_ns, path_in(t, parent, name))])

    def rmdir(self, parent: int, name: bytes) -> int:
        return self._change("rmdir", lambda t: ns.rmdir(t, parent, name),
                            lambda t, _: [Event(ev.REMOVE, t.gen, t.now_ns, path_in(t, parent, name))])

    def rename(self, parent: int, name: bytes, new_parent: int, new_name: bytes, noreplace: bool = False) -> int | None:
        writing = frozenset(self._sessions)

        def describe(txn: Txn, _replaced: int | None) -> list[Event]:
            moved = ns.lookup(txn.conn, new_parent, new_name, txn.gen)
            return [Event(ev.RENAME, txn.gen, txn.now_ns, path_in(txn, new_parent, new_name), path_in(txn, parent, name),
                          size=moved.size if moved.is_file else None)]

        return self._change("rename", lambda t: ns.rename(t, parent, name, new_parent, new_name, noreplace, writing), describe)

    def setattr(
        self,
        ino: int,
        *,
        mode: int | None = None,
        uid: int | None = None,
        gid: int | None = None,
        mtime_ns: int | None = None,
        atime_ns: int | None = None,
        size: int | None = None,
    ) -> Attr:
        """chmod/chown/utimens, and truncate when `size` is given (a new version)."""
        if size is not None:
            attr = self.getattr(ino)
            if attr.is_dir:
                raise IsADirectory("cannot truncate a directory")
            if not attr.is_file:
                raise InvalidArgument("can only truncate regular files")
            session = self._sessions.get(ino)
            if session is not None:
                session.truncate(size)
            elif size != attr.size:
                with self.open_session(ino) as s:
                    s.truncate(size)
                    s.commit()
        if mode is None and uid is None and gid is None and mtime_ns is None and atime_ns is None and size is None:
            return self.getattr(ino)

        def fn(txn: Txn) -> Attr:
            ns.setattr_(txn, ino, mode, uid, gid, mtime_ns, atime_ns)
            return ns.getattr_(txn.conn, ino, txn.gen)

        return self._with_session_size(self._change("setattr", fn))

    def setxattr(self, ino: int, name: bytes, value: bytes, flags: int = 0) -> None:
        """Set extended attribute `name` (flags: xattrs.XATTR_CREATE, XATTR_REPLACE)."""
        if name == xattrs.CAPABILITY:
            self.capabilities_stored = True  # before it can be read: Store.may_have_xattr
        self._change("setxattr", lambda t: xattrs.set_(t, ino, name, value, flags))

    def removexattr(self, ino: int, name: bytes) -> None:
        self._change("removexattr", lambda t: xattrs.remove(t, ino, name))

    def _with_session_size(self, attr: Attr) -> Attr:
        """`attr` as the caller sees the file: with the size of its open write session, if any."""
        session = self._sessions.get(attr.ino)
        return replace(attr, size=session.size) if session is not None and session.size != attr.size else attr
