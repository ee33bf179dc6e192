"""cowfs storage engine: log segments, chunking, catalog, versions, snapshots, gc, fsck.

Knows nothing of FUSE. `Store` is the only entry point.
"""
from .namespace import Attr
from .schema import ROOT_INO
from .history import VersionInfo
from .snapshots import Snapshot
from .store import Store

__all__ = ["Attr", "ROOT_INO", "Snapshot", "Store", "VersionInfo"]
