"""A DCP checkpoint is whole when its `.metadata` and every data file the metadata names are
there: across the stores of a job (remote/merge.py) the coordinator's `.metadata` can show
before another node's `__R_N.distcp` files have arrived.

The names are found without unpickling: `.metadata` is a pickle of torch's `Metadata`, whose
`storage_data` holds each item's `_StorageInfo(relative_path, offset, length)`; the
relative paths are the pickle's string constants ending in `.distcp`, read with
`pickletools.genops`, which decodes opcodes and runs no code (the daemon never imports
torch, and never unpickles user data).
"""
from __future__ import annotations

import pickletools
import sqlite3
import stat

from ...errors import CowfsError
from ..catalog import namespace as ns

MAX_METADATA_BYTES = 256 << 20  # a larger `.metadata` is not read: the checkpoint is taken as whole
DATA_SUFFIX = ".distcp"
_STRINGS = frozenset({"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "SHORT_BINSTRING", "BINSTRING",
                      "STRING"})


def named_files(metadata: bytes) -> set[str] | None:
    """The data files (names relative to the checkpoint's directory) that `metadata` names;
    None when it is not a pickle."""
    out: set[str] = set()
    try:
        for op, arg, _ in pickletools.genops(metadata):
            if op.name in _STRINGS and isinstance(arg, str) and arg.endswith(DATA_SUFFIX):
                out.add(arg)
    except (ValueError, EOFError, UnicodeDecodeError, IndexError, TypeError):
        return None
    return out


def missing_files(conn: sqlite3.Connection, dir_ino: int, gen: int, names: set[str]) -> list[str]:
    """Of `names` (relative paths in the directory `dir_ino`), those that are not a non-empty
    regular file as of `gen`, sorted."""
    out = []
    for name in sorted(names):
        ino = dir_ino
        try:
            for part in name.split("/"):
                if part and part != ".":
                    ino = ns.lookup(conn, ino, part.encode(), gen).ino
            v = ns.version_row(conn, ino, gen)
            if v is None or not stat.S_ISREG(v.mode) or v.size == 0:
                out.append(name)
        except CowfsError:  # NotFound, NotADirectory, a bad name: not there
            out.append(name)
    return out
