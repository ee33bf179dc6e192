"""cowfs storage engine: the log, the catalog, the data path, tensor storage, upkeep and
checkpoint awareness, in the subpackages named so (docs/design.md, "Module map").

Knows nothing of FUSE. `Store` (store.py) is the only entry point for the FUSE layer and
the CLI; tree.py is its tree-changing part, recovery.py what it does at open, and parts.py
names the parts it gives the operations below it. Each subpackage's docstring says what it
owns and what it may import (tests/engine/test_structure.py holds them to it).
"""
from .catalog.history import VersionInfo
from .catalog.namespace import Attr
from .catalog.schema import ROOT_INO
from .catalog.snapshots import Snapshot
from .store import Store

__all__ = ["Attr", "ROOT_INO", "Snapshot", "Store", "VersionInfo"]
