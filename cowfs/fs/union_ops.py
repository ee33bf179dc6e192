"""A producer's mount of the job's namespace (`cowfs mount STORE MNT --all-stores`, the store's
remote set): its own tree, writable as ever, with the other nodes' files beside it
(docs/design.md section 17, "A node's own mount of the namespace").

The other stores under the prefix are followed as a consumer of every store follows them
(remote/union_source.py, leaving this store out), into a merged catalog in `STORE/peers/`
that a `Replica` serves; this module lays that tree under the store's own, by path:

* A path the store has shows the store's entry, unless another store's entry there wins by
  the clash rule (union_clash.py: the later change, as on every consumer); a directory both
  have lists the union of their entries.
* A path only the peers have shows theirs, in a view of its own (FUSE inode numbers
  `view << 40 | merged inode`), read-only, live (1 s timeouts), read from the bucket and
  checked as a consumer's reads are.
* Creating something in a directory only the peers have first makes that directory, and
  every one above it the store lacks, in the store (with the peers' mode and owner): the
  new file is the store's own. Opening a peer's file for writing gives the store its own
  file at that path (holding the peer's bytes first unless O_TRUNC: a copy-up), which wins
  from then on. Removing or renaming a peer's file fails with EROFS: it is another node's.

The peers' steps invalidate what the kernel caches of what they changed, in the peer view
and, for entries of directories the store also has, in the store's view.
"""
from __future__ import annotations

import errno
import logging
import os
import stat
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Coroutine

import pyfuse3
import trio

from ..errors import CowfsError, Exists, InvalidArgument, NotADirectory, NotFound, ReadOnly
from ..remote.changes import Changes
from ..remote.config import read_remote_config
from ..remote.merge import NAMESPACE_UUID
from ..remote.replica import Replica
from ..remote.union_source import UnionSource
from ..store import Attr, Store
from ..store.catalog.events import SNAPSHOT, SNAPSHOT_DELETE, Event, EventBus
from ..store.catalog.schema import ROOT_INO
from ..store.log.layout import DEFAULT_SEGMENT_SIZE, StoreConfig
from .dispatch import in_thread, translate_errors
from .operations import CowfsOperations
from .replica_changes import events_between
from .union_clash import PeerWins
from .views import LIVE_VIEW, SNAPDIR_INO, View, ViewTable

if TYPE_CHECKING:
    from ..store.data.session import WriteSession

log = logging.getLogger("cowfs.fs")
PEERS_VIEW = "peers"
COPY_PIECE = 4 << 20  # bytes per read when a peer's file is copied up (opened for writing without O_TRUNC)

Entries = list[tuple[bytes, pyfuse3.EntryAttributes]]


def _join(path: str, name: bytes) -> str:
    return path.rstrip("/") + "/" + os.fsdecode(name)


class UnionOperations(CowfsOperations):
    def __init__(self, store: Store, peers: "Peers") -> None:
        super().__init__(store)
        self.peers = peers.replica
        self.wins = peers.wins
        self.peer_view: View = self.views.reserve(PEERS_VIEW)
        self._redirect: dict[int, int] = {}  # a peer file's FUSE inode -> the store's file written over it
        self.peer_events = EventBus()  # the peers' changes as this mount shows them (`cowfs watch` hears both)

    # -- where a path is ------------------------------------------------------------------

    def _is_peer(self, view: View) -> bool:
        return view.view_id == self.peer_view.view_id

    def _path(self, store: Store, ino: int) -> str:
        if ino == ROOT_INO:
            return "/"
        paths = store.paths_of(ino, store.generation)
        if not paths:
            raise NotFound(f"inode {ino}: no path")
        return paths[0]

    @staticmethod
    def _at(store: Store, path: str) -> Attr | None:
        try:
            return store.resolve(path)
        except (NotFound, NotADirectory):
            return None

    def _peer_entry(self, attr: Attr) -> pyfuse3.EntryAttributes:
        return self._entry(self.peer_view, attr)

    def store_of(self, view: View) -> Store:
        return self.peers if self._is_peer(view) else self.store

    def file_of(self, fuse_ino: int) -> tuple[View, int]:
        own = self._redirect.get(fuse_ino)
        return (LIVE_VIEW, own) if own is not None else super().file_of(fuse_ino)

    # -- lookups and listings -----------------------------------------------------------------

    @translate_errors
    async def lookup(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        if parent_inode == SNAPDIR_INO:
            return await super().lookup(parent_inode, name, ctx)
        view, ino = self._decode(parent_inode)
        if view.live:
            if self.wins:  # another store's later change at this path shows instead (union_clash.py)
                path = _join(self._path(self.store, ino), name)
                theirs = self._at(self.peers, path) if path in self.wins else None
                if theirs is not None:
                    return self._peer_entry(theirs)
            try:
                return await super().lookup(parent_inode, name, ctx)
            except pyfuse3.FUSEError as e:
                if e.errno != errno.ENOENT:
                    raise
            path = _join(self._path(self.store, ino), name)
        elif self._is_peer(view):
            path = _join(self._path(self.peers, ino), name)
            if path not in self.wins:
                try:  # the store's own entry (made there since the kernel looked up the parent)
                    return self._known(LIVE_VIEW, self.store.holds.looked_up(lambda: self.store.resolve(path)))
                except (NotFound, NotADirectory):
                    pass
        else:
            return await super().lookup(parent_inode, name, ctx)
        attr = self._at(self.peers, path)
        if attr is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._peer_entry(attr)

    @translate_errors
    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        own = self._redirect.get(inode)
        if own is not None:  # a peer's file written over here: the store's own file
            entry = self._entry(LIVE_VIEW, self.store.getattr(own))
            entry.st_ino = inode
            return entry
        return await super().getattr(inode, ctx)  # a peer's file: from the peers (store_of)

    def _own_inode(self, inode: int) -> int:
        """The store's FUSE inode for `inode` (a peer's file written over here: the store's copy)."""
        own = self._redirect.get(inode)
        return inode if own is None else ViewTable.encode(LIVE_VIEW, own)

    @translate_errors
    async def getxattr(self, inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> bytes:
        return await super().getxattr(self._own_inode(inode), name, ctx)

    @translate_errors
    async def listxattr(self, inode: int, ctx: pyfuse3.RequestContext) -> list[bytes]:
        return await super().listxattr(self._own_inode(inode), ctx)

    @translate_errors
    async def setxattr(self, inode: int, name: bytes, value: bytes, ctx: pyfuse3.RequestContext) -> None:
        await super().setxattr(self._own_inode(inode), name, value, ctx)

    @translate_errors
    async def removexattr(self, inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        await super().removexattr(self._own_inode(inode), name, ctx)

    def _listing(self, view: View, ino: int) -> Entries:
        """(worker thread) A directory of the store or of the peers, with the other side's
        entries at the same path (the store's win)."""
        if view.live:
            own = [(name, self._entry(LIVE_VIEW, a)) for name, a in self.store.readdir(ino)]
            path = self._path(self.store, ino)
            peer_dir = self._at(self.peers, path)
            theirs = [] if peer_dir is None or not peer_dir.is_dir else self.peers.readdir(peer_dir.ino)
        else:
            path = self._path(self.peers, ino)
            own_dir = self._at(self.store, path)
            own = [] if own_dir is None or not own_dir.is_dir else [
                (name, self._entry(LIVE_VIEW, a)) for name, a in self.store.readdir(own_dir.ino)]
            theirs = self.peers.readdir(ino)
        if self.wins:  # the store's entries another store's later change wins over (union_clash.py)
            beaten = {name for name, _ in own if _join(path, name) in self.wins}
            own = [(name, e) for name, e in own if name not in beaten]
        names = {name for name, _ in own}
        return own + [(name, self._peer_entry(a)) for name, a in theirs if name not in names]

    @translate_errors
    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        if inode == SNAPDIR_INO:
            return await super().opendir(inode, ctx)
        view, ino = self._decode(inode)
        if not view.live and not self._is_peer(view):
            return await super().opendir(inode, ctx)
        entries = await in_thread(self._listing, view, ino)
        self._dir_ids += 1
        self._dirs[self._dir_ids] = entries
        return self._dir_ids

    # -- reading the peers' files -------------------------------------------------------------

    @translate_errors
    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        if inode == SNAPDIR_INO:
            return await super().open(inode, flags, ctx)
        writable = bool(flags & (os.O_WRONLY | os.O_RDWR))
        own = self._redirect.get(inode)
        if own is not None:  # written over here, and the kernel has not looked the name up since
            if writable:
                f = await self._open_writer(inode, own, bool(flags & os.O_TRUNC), ctx.pid)
                return pyfuse3.FileInfo(fh=f.fh, keep_cache=True)
            return await super().open(ViewTable.encode(LIVE_VIEW, own), flags, ctx)
        view, ino = self._decode(inode)
        if writable and self._is_peer(view):
            return await self._write_over(inode, ino, flags, ctx)
        return await super().open(inode, flags, ctx)  # a peer's file: read from the peers (store_of)

    # -- writing over a peer's file: the store's own file at its path from then on ----------

    def _own_file(self, path: str, peer_ino: int, copy: bool) -> Attr:
        """(worker thread) The store's file at `path` (a peer's file there), made with the peer
        file's mode and owner, in its directory made first, unless one was made meanwhile (the
        store's own wins). With `copy`, made holding the peer file's bytes: the file and that
        first version in one transaction (`Store.create_filled`), so that no crash leaves it
        empty over the peer's, and a failed copy makes nothing. Without (O_TRUNC: an empty file
        is what the writer asked for), not durable until the close's commit."""
        head, _, name = path.rpartition("/")
        parent = self._copy_up(head or "/")
        theirs = self.peers.getattr(peer_ino)
        mode = stat.S_IMODE(theirs.mode)
        try:
            if copy:
                return self.store.create_filled(parent, os.fsencode(name), lambda session: self._copy_bytes(session, peer_ino),
                                                mode, theirs.uid, theirs.gid)
            return self.store.create(parent, os.fsencode(name), mode, theirs.uid, theirs.gid, durable=False)
        except Exists:
            return self.store.lookup(parent, os.fsencode(name))

    async def _write_over(self, inode: int, peer_ino: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        """Open a peer's file for writing: the store gets its own file at that path (without
        O_TRUNC, holding the peer's bytes from its first version on: a copy-up, so that a crash
        while this handle writes, or during this open, leaves the file as it showed, not empty)
        and this handle writes it; the kernel's inode stays the peer's until it looks the name up
        again, so its attributes and changes are the store file's meanwhile (`_redirect`)."""
        path = await in_thread(self._path, self.peers, peer_ino)
        truncate = bool(flags & os.O_TRUNC)
        own = await in_thread(self._own_file, path, peer_ino, not truncate)
        f = await self._open_writer(inode, own.ino, truncate, ctx.pid)
        self._redirect[inode] = own.ino
        await in_thread(self._invalidate_path, path)
        return pyfuse3.FileInfo(fh=f.fh, keep_cache=True)

    def _copy_bytes(self, session: "WriteSession", peer_ino: int) -> None:
        """(worker thread) The peer file's bytes written into a session, COPY_PIECE at a time."""
        with self.peers.open_reader(peer_ino) as reader:
            for off in range(0, reader.size, COPY_PIECE):
                session.write(off, bytes(reader.read(off, min(COPY_PIECE, reader.size - off))))

    def _invalidate_path(self, path: str) -> None:
        """(worker thread) The kernel's entries for `path`, in the peer view and the store's:
        its next lookup finds the store's own file."""
        head, _, name = path.rpartition("/")
        for store, view in ((self.peers, self.peer_view), (self.store, LIVE_VIEW)):
            parent = self._at(store, head or "/")
            if parent is not None:
                pyfuse3.invalidate_entry_async(ViewTable.encode(view, parent.ino), os.fsencode(name),
                                               ignore_enoent=True)

    @translate_errors
    async def setattr(self, inode: int, attr: pyfuse3.EntryAttributes, fields: pyfuse3.SetattrFields,
                      fh: int | None, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        own = self._redirect.get(inode)
        if own is not None:
            entry = await super().setattr(ViewTable.encode(LIVE_VIEW, own), attr, fields, fh, ctx)
            entry.st_ino = inode
            return entry
        return await super().setattr(inode, attr, fields, fh, ctx)

    async def forget(self, inode_list: list[tuple[int, int]]) -> None:
        for inode, _ in inode_list:
            self._redirect.pop(inode, None)
        await super().forget(inode_list)

    # -- changes: the store's own, in directories made there first -----------------------------

    def _copy_up(self, path: str) -> int:
        """(worker thread) The store's directory at `path`, made with every missing one above
        it, each with the mode and owner of the peers' directory there."""
        ino, here = ROOT_INO, "/"
        for part in [p for p in path.split("/") if p]:
            here = _join(here, os.fsencode(part))
            name = os.fsencode(part)
            try:
                attr = self.store.lookup(ino, name)
            except NotFound:
                theirs = self._at(self.peers, here)
                if theirs is None or not theirs.is_dir:
                    raise NotFound(f"{here}: no such directory") from None
                try:
                    attr = self.store.mkdir(ino, name, stat.S_IMODE(theirs.mode), theirs.uid, theirs.gid)
                except Exists:  # made meanwhile by another request
                    attr = self.store.lookup(ino, name)
            if not attr.is_dir:
                raise NotADirectory(f"{here}: not a directory")
            ino = attr.ino
        return ino

    async def _own_parent(self, parent_inode: int) -> int:
        """The FUSE inode of the store's directory a change under `parent_inode` goes to."""
        if parent_inode == SNAPDIR_INO:
            return parent_inode
        view, ino = self._decode(parent_inode)
        if not self._is_peer(view):
            return parent_inode
        path = await in_thread(self._path, self.peers, ino)
        return ViewTable.encode(LIVE_VIEW, await in_thread(self._copy_up, path))

    @translate_errors
    async def mkdir(self, parent_inode: int, name: bytes, mode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        return await super().mkdir(await self._own_parent(parent_inode), name, mode, ctx)

    @translate_errors
    async def create(self, parent_inode: int, name: bytes, mode: int, flags: int,
                     ctx: pyfuse3.RequestContext) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        return await super().create(await self._own_parent(parent_inode), name, mode, flags, ctx)

    @translate_errors
    async def mknod(self, parent_inode: int, name: bytes, mode: int, rdev: int,
                    ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        return await super().mknod(await self._own_parent(parent_inode), name, mode, rdev, ctx)

    @translate_errors
    async def symlink(self, parent_inode: int, name: bytes, target: bytes,
                      ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        return await super().symlink(await self._own_parent(parent_inode), name, target, ctx)

    async def _shown_is_peers(self, parent_inode: int, name: bytes, missing: bool) -> bool:
        """Whether the entry shown at `name` under the store's directory `parent_inode` is
        another store's: one that wins there by the clash rule, or (`missing`: the store has
        none) any the peers hold."""
        view, ino = self._decode(parent_inode)
        if not view.live or (not missing and not self.wins):
            return False
        path = _join(await in_thread(self._path, self.store, ino), name)
        if path in self.wins:
            return True
        return missing and await in_thread(self._at, self.peers, path) is not None

    async def _own_only(self, parent_inode: int, name: bytes, what: str, change: Coroutine[Any, Any, None]) -> None:
        """Run `change` (a removal of the store's entry), or EROFS when the entry shown there is
        another store's."""
        if await self._shown_is_peers(parent_inode, name, missing=False):
            change.close()
            raise ReadOnly(f"another node's {what}: read-only here")
        try:
            await change
        except pyfuse3.FUSEError as e:
            if e.errno == errno.ENOENT and await self._shown_is_peers(parent_inode, name, missing=True):
                raise ReadOnly(f"another node's {what}: read-only here") from None
            raise

    @translate_errors
    async def unlink(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        await self._own_only(parent_inode, name, "file", super().unlink(parent_inode, name, ctx))

    @translate_errors
    async def rmdir(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        await self._own_only(parent_inode, name, "directory", super().rmdir(parent_inode, name, ctx))

    @translate_errors
    async def link(self, inode: int, new_parent_inode: int, new_name: bytes,
                   ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        return await super().link(inode, await self._own_parent(new_parent_inode), new_name, ctx)

    @translate_errors
    async def rename(self, parent_inode_old: int, name_old: bytes, parent_inode_new: int, name_new: bytes,
                     flags: int, ctx: pyfuse3.RequestContext) -> None:
        if parent_inode_old != SNAPDIR_INO and self._is_peer(self._decode(parent_inode_old)[0]):
            raise ReadOnly("another node's file: read-only here")

        async def move() -> None:
            await super(UnionOperations, self).rename(parent_inode_old, name_old,
                                                      await self._own_parent(parent_inode_new), name_new, flags, ctx)

        await self._own_only(parent_inode_old, name_old, "file", move())

    # -- the peers' steps -----------------------------------------------------------------------

    def _shown_events(self, changes: Changes) -> list[Event]:
        """(worker thread, after `_stale` applied the clash rule) The watch events of a peers'
        step at the paths where this mount shows the peers' entry: the store holds nothing
        there, or a directory (they merge), or a peer's later change wins there."""
        def shown(path: str | None) -> bool:
            if path is None:
                return False
            own = self._at(self.store, path)
            return own is None or own.is_dir or path in self.wins

        return [e for e in events_between(self.peers, changes)
                if e.kind not in (SNAPSHOT, SNAPSHOT_DELETE) and (shown(e.path) or shown(e.old_path))]

    def _stale(self, changes: Changes) -> tuple[list[tuple[int, bytes]], list[int]]:
        """(worker thread) The clash rule applied at the paths a peers' step changed, and the
        kernel's entries and inodes it made stale."""
        entries, paths = [], set()
        for parent, name in changes.entries:
            entries.append((ViewTable.encode(self.peer_view, parent), name))
            try:
                path = self._path(self.peers, parent)
            except CowfsError:
                continue
            paths.add(_join(path, name))
            own_dir = self._at(self.store, path)
            if own_dir is not None and own_dir.is_dir:
                entries.append((ViewTable.encode(LIVE_VIEW, own_dir.ino), name))
        for ino in changes.inos:  # a new version at a path the store holds too may win there now
            paths.update(self.peers.paths_of(ino, self.peers.generation))
        for path in self.wins.look(paths):  # the winner changed: the kernel looks the name up again
            head, _, name = path.rpartition("/")
            own_dir = self._at(self.store, head or "/")
            if own_dir is not None and own_dir.is_dir:
                entries.append((ViewTable.encode(LIVE_VIEW, own_dir.ino), os.fsencode(name)))
        return entries, [ViewTable.encode(self.peer_view, ino) for ino in changes.inos]

    async def peers_changed(self, changes: Changes) -> None:
        """Drop what the kernel caches of what a peers' step changed, and tell `cowfs watch`."""
        entries, inodes = await in_thread(self._stale, changes)
        if self.peer_events.active:
            self.peer_events.publish(await in_thread(self._shown_events, changes))
        for parent, name in entries:
            pyfuse3.invalidate_entry_async(parent, name, ignore_enoent=True)

        def invalidate() -> None:
            for ino in inodes:
                try:
                    pyfuse3.invalidate_inode(ino)
                except Exception:  # noqa: BLE001 - not cached: nothing to drop
                    pass

        await trio.to_thread.run_sync(invalidate)


PEERS_DIR = "peers"  # STORE/peers/: the peers' merged catalog and blocks (format.md section 9.7)


@dataclass
class Peers:
    """The other stores under the prefix, followed (`source`) and served (`replica`), and the
    paths where one of them wins over the store (`wins`)."""
    source: UnionSource
    replica: Replica
    wins: PeerWins

    def close(self) -> None:
        self.wins.close()
        self.replica.close()
        self.source.close()


def open_peers(store: Store, cache_size: int) -> Peers:
    """The store's peers under its remote's prefix, each at its newest catalog object."""
    cfg = read_remote_config(store.root)
    if cfg is None:
        raise InvalidArgument(f"--all-stores: {store.root} has no remote (cowfs remote set STORE s3://BUCKET/PREFIX "
                              "names the job's namespace)")
    cache = store.root / PEERS_DIR
    cache.mkdir(exist_ok=True)
    source = UnionSource(cache, cfg, exclude=store.config.store_uuid)
    try:
        source.catch_up()
        config = StoreConfig(store_uuid=NAMESPACE_UUID, device="file", segment_size=DEFAULT_SEGMENT_SIZE)
        replica = Replica(cache, config, source.path, source, cache_size)
    except BaseException:
        source.close()
        raise
    wins = PeerWins(store, source)
    peers = Peers(source, replica, wins)
    try:
        wins.look_everywhere()
    except BaseException:
        peers.close()
        raise
    return peers
