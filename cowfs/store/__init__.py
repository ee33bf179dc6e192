"""cowfs storage engine: the log, the catalog, the data path, tensor storage, upkeep and
checkpoint awareness, in the subpackages named so (docs/design.md, "Module map").

Knows nothing of FUSE. `Store` (store.py) is the only entry point for the FUSE layer and
the CLI; tree.py is its tree-changing part, recovery.py what it does at open, and parts.py
names the parts it gives the operations below it. Each subpackage's docstring says what it
owns and what it may import (tests/engine/test_structure.py holds them to it).

The names below are loaded when first used, so that a process that needs only a leaf
module (the CLI that talks to a mounted store's daemon reads `log/layout.py`) does not
import the whole engine (0.2 s of every such command's start).
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .catalog.history import VersionInfo
    from .catalog.namespace import Attr
    from .catalog.schema import ROOT_INO
    from .catalog.snapshots import Snapshot
    from .store import Store

_WHERE = {"Attr": ".catalog.namespace", "ROOT_INO": ".catalog.schema", "Snapshot": ".catalog.snapshots",
          "Store": ".store", "VersionInfo": ".catalog.history"}

__all__ = ["Attr", "ROOT_INO", "Snapshot", "Store", "VersionInfo"]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value
