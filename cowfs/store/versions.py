"""Snapshots and history (snapshot, history, diff, restore, restore_tree, expire): each a
read or one catalog transaction, with the events that name it. A part of Store."""
from __future__ import annotations

import stat
import time
from typing import TYPE_CHECKING, Callable, TypeVar

from ..errors import Busy, InvalidArgument, IsADirectory, NotADirectory
from .catalog import events as ev
from .catalog import history as hist
from .catalog import namespace as ns
from .catalog import snapshots as snaps
from .catalog.db import Catalog, Txn
from .catalog.events import Event
from .catalog.history import VersionInfo
from .catalog.namespace import Attr
from .catalog.schema import KIND_FILE
from .catalog.snapshots import Snapshot
from .data.commit import version_events
from .upkeep.diff import DiffReport, compare
from .upkeep.restore_tree import RestoredTree, restore_dir

if TYPE_CHECKING:
    from .data.holds import Holds
    from .data.session import WriteSession

T = TypeVar("T")


class VersionChanges:
    """The snapshot and history methods of Store (which provides what is declared here)."""

    if TYPE_CHECKING:
        _sessions: dict[int, WriteSession]
        catalog: Catalog
        holds: Holds

        def _change(self, op: str, fn: Callable[[Txn], T], describe: Callable[[Txn, T], list[Event]] | None = None,
                    durable: bool = True) -> T: ...

        def _read(self, fn: Callable[..., T], gen: int | None) -> T: ...

        def resolve(self, path: str | bytes, gen: int | None = None) -> Attr: ...

    def snapshot_create(self, name: str, gen: int | None = None) -> Snapshot:
        """A snapshot of the tree as of now, or as of the earlier generation `gen` (HistoryDropped
        if expire or repair ran since)."""
        return self._change("snapshot", lambda t: snaps.create(t, name, gen),
                            lambda t, s: [Event(ev.SNAPSHOT, s.gen, s.created_ns, snapshot=s.name)])

    def snapshot_list(self) -> list[Snapshot]:
        return self.catalog.read(snaps.listing)

    def snapshot(self, name: str) -> Snapshot:
        return self.catalog.read(lambda c: snaps.get(c, name))

    def snapshot_delete(self, name: str) -> None:
        self._change("snapshot-delete", lambda t: snaps.delete(t, name),
                     lambda t, _: [Event(ev.SNAPSHOT_DELETE, t.gen, t.now_ns, snapshot=name)])

    def history(self, target: int | str | bytes) -> list[VersionInfo]:
        """Content versions, newest first, of an inode or of a path (history.py)."""
        return self.catalog.read(lambda c: hist.history(c, target))

    def diff(self, gen_a: int, gen_b: int | None = None) -> DiffReport:
        """Paths added, removed and changed from generation `gen_a` to `gen_b` (default: the live tree)."""
        return self._read(lambda c, g: compare(c, gen_a, g), gen_b)

    def restore(self, path: str, gen: int, to: str | None = None) -> Attr:
        """Make the file at `path` as of generation `gen` current again at `to` (default: `path`),
        as a new version that shares the old body: history is kept, no bytes are copied."""
        old = self.resolve(path, gen)
        if not old.is_file:
            raise IsADirectory(f"{path}: not a regular file (a directory is restored by restore_tree)")
        dest = (to or path).encode() if isinstance(to or path, str) else (to or path)
        head, _, name = dest.strip(b"/").rpartition(b"/")
        parent = self.resolve(head)
        if not parent.is_dir:
            raise NotADirectory(f"{head.decode(errors='replace')}: not a directory")

        def fn(txn: Txn) -> Attr:
            ino = ns.live_child(txn, parent.ino, name)
            if ino is None:
                ino = ns.make_node(txn, parent.ino, name, KIND_FILE, old.mode & 0o7777, old.uid, old.gid)
            elif ino in self._sessions:
                raise Busy(f"{dest.decode(errors='replace')}: the file is open for writing")
            row = ns.live_version(txn, ino)
            if not stat.S_ISREG(row.mode):
                raise IsADirectory(f"{dest.decode(errors='replace')}: not a regular file")
            ns.new_version(txn, row, size=old.size, mtime_ns=txn.now_ns, ctime_ns=txn.now_ns,
                           content_id=old.content_id, data_gen=txn.gen)
            return ns.getattr_(txn.conn, ino, txn.gen)

        return self._change("restore", fn, version_events)

    def restore_tree(self, path: str, gen: int, to: str | None = None) -> RestoredTree:
        """Make the directory at `path` as of generation `gen` live again at `to` (default:
        `path`, which must not exist), whole, in one transaction (restore_tree.py)."""
        old = self.resolve(path, gen)
        if not old.is_dir:
            raise NotADirectory(f"{path}: not a directory")
        dest = to or path
        head, _, name = dest.encode().strip(b"/").rpartition(b"/")
        if not name:
            raise InvalidArgument("the root directory cannot be restored over; restore to a path with --to")
        parent = self.resolve(head)

        def describe(txn: Txn, r: RestoredTree) -> list[Event]:
            return [e for ino in r.files for e in version_events(txn, ns.getattr_(txn.conn, ino, txn.gen))]

        return self._change("restore", lambda t: restore_dir(t, old, gen, parent.ino, name, dest), describe)

    def expire_history(self, keep_within_ns: int = 0) -> int:
        """Drop versions and entries that the live tree replaced or removed, that no snapshot
        shows, and that ended more than `keep_within_ns` ago, except those of inodes the kernel
        still knows (holds.py). gc then reclaims their chunks."""
        cutoff = time.time_ns() - keep_within_ns
        return self._change("expire", lambda t: hist.expire(t, cutoff, self.holds.known_inodes()))
