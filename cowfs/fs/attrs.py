"""FUSE attributes (what stat shows) from the engine's, for the live tree, snapshots and
the `.snapshots` directory. A live file with an open write session shows what its coming
commit will: the session's size, the mtime the kernel gave, and the time of a truncate
(the kernel leaves a size change's mtime and ctime to the file system)."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pyfuse3

from ..store import Attr, Store
from .handles import SharedSession
from .views import SNAPDIR_INO, View, ViewTable

LIVE_TIMEOUT = 1.0
SNAPSHOT_TIMEOUT = 300.0
# st_blksize, the "preferred I/O size": cp, stdio and Python's open() size their buffers by
# it, and without the writeback cache every write(2) is at least one FUSE request (and one
# security.capability probe). 4 MiB, as Lustre reports a 4 MiB stripe: cp's 128 KiB writes
# became 1 MiB ones (issue 15), then 4 MiB ones, which the kernel sends as four requests of
# 1020 KiB and one of 16 KiB where the mount asks for requests that libfuse splices
# (write_requests.py; a 1 MiB write took two, 1020 KiB and 4 KiB). docs/benchmarks.md.
PREFERRED_IO = 4 << 20


def entry_of(view: View, attr: Attr, shared: SharedSession | None = None) -> pyfuse3.EntryAttributes:
    e = pyfuse3.EntryAttributes()
    e.st_ino = ViewTable.encode(view, attr.ino)
    e.generation = 0
    timeout = LIVE_TIMEOUT if view.gen is None else SNAPSHOT_TIMEOUT  # a live tree: this store's or its peers'
    e.entry_timeout = timeout
    e.attr_timeout = timeout
    e.st_mode = attr.mode
    e.st_nlink = attr.nlink
    e.st_uid = attr.uid
    e.st_gid = attr.gid
    e.st_rdev = attr.rdev
    size, mtime, ctime = attr.size, attr.mtime_ns, attr.ctime_ns
    if shared is not None:
        size = shared.session.size
        if shared.session.mtime_ns is not None:
            mtime = shared.session.mtime_ns
        if shared.truncated_ns is not None:
            mtime = max(mtime, shared.truncated_ns)
        ctime = max(ctime, mtime)
    e.st_size = size
    e.st_blksize = PREFERRED_IO
    e.st_blocks = (size + 511) // 512
    e.st_atime_ns = attr.atime_ns
    e.st_mtime_ns = mtime
    e.st_ctime_ns = ctime
    return e


def snapdir_entry(store: Store) -> pyfuse3.EntryAttributes:
    """`.snapshots`: a directory with one entry per snapshot, timed by the newest."""
    snaps = store.snapshot_list()
    root = store.getattr(1)
    e = pyfuse3.EntryAttributes()
    e.st_ino = SNAPDIR_INO
    e.entry_timeout = e.attr_timeout = 0
    e.st_mode = stat.S_IFDIR | 0o755
    e.st_nlink = 2 + len(snaps)
    e.st_uid, e.st_gid = root.uid, root.gid
    newest = max((s.created_ns for s in snaps), default=root.ctime_ns)
    e.st_atime_ns = e.st_mtime_ns = e.st_ctime_ns = newest
    e.st_blksize = 4096
    return e


def statfs_of(root: Path) -> pyfuse3.StatvfsData:
    """What statfs shows: the file system holding the store."""
    st = os.statvfs(root)
    s = pyfuse3.StatvfsData()
    s.f_bsize, s.f_frsize = st.f_bsize, st.f_frsize
    s.f_blocks, s.f_bfree, s.f_bavail = st.f_blocks, st.f_bfree, st.f_bavail
    s.f_files, s.f_ffree, s.f_favail = st.f_files, st.f_ffree, st.f_favail
    s.f_namemax = 255
    return s
