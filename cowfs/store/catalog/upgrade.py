"""`cowfs upgrade STORE`: bring a store of an older format version to this one, in place.

Version 1 -> 2: the catalog gets chunks.codec (0 for every existing record: they are all
raw), chunks.base_cid, contents.compacted and the lineage table. Version 2 -> 3: the
lineage keeps a row per compacted body (lineage.gen); each version 2 row, the newest piece
of its lineage, gets the generation that first stored its chunk (chunks.first_gen, the
generation of the body it was compacted from). A store is brought from its version to
this one in one catalog transaction; then the config file is rewritten with the new
version (atomic rename). Segment files need no change: a version 1 record is a raw
version 2 and 3 record. Crash states: before the catalog commit, nothing changed; after
it and before the config rename, the config still says the old version and opening the
store asks for the upgrade again, which finds the catalog done and only rewrites the
config. Version 3 -> 4: versions.nlink, kept in each version row so that stat of a directory
does not count its entries; it is filled in for every existing version (a directory's
subdirectories as of the generation its version row was born: every change of a
directory's entries gives it a new version row, so that count holds over the row's life).
Version 4 -> 5: versions.atime_ns (set to the row's mtime, which is what stat showed as
atime before), versions.rdev (0) and versions.xattrs (NULL); inodes may now be of kind 4
(fifos, sockets, device nodes), which older stores have none of. Version 5 -> 6: records may
be of codec 4 (fdelta, the context-modelled float delta); no table changes, only the
version moves, so that a cowfs that cannot decode such records refuses the store instead of
failing on its reads. Version 6 -> 7: the same for codec 5 (fdelta32, the float delta with 32
rANS states); the store's codec 4 records stay as they are and are still read.
"""
from __future__ import annotations

import fcntl
import json
import os
import sqlite3
from pathlib import Path
from typing import Callable, Sequence

from ...errors import Busy, StoreError
from ..log.layout import CATALOG_FILE, CONFIG_FILE, FORMAT_VERSION, LOCK_FILE, OLDEST_UPGRADABLE, config_data, fsync_dir
from .schema import SCHEMA_VERSION

CATALOG_1_TO_2 = (
    "ALTER TABLE chunks ADD COLUMN codec INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE chunks ADD COLUMN base_cid INTEGER",
    "CREATE INDEX chunks_base ON chunks(base_cid) WHERE base_cid IS NOT NULL",
    "ALTER TABLE contents ADD COLUMN compacted INTEGER NOT NULL DEFAULT 0",
    "CREATE INDEX contents_pending ON contents(content_id) WHERE compacted = 0",
    "CREATE TABLE lineage (tensor_key BLOB NOT NULL, piece INTEGER NOT NULL, cid INTEGER NOT NULL,"
    " PRIMARY KEY (tensor_key, piece)) WITHOUT ROWID",
    "UPDATE meta SET value = 2 WHERE key = 'schema_version'",
)
CATALOG_2_TO_3 = (
    "CREATE TABLE lineage3 (tensor_key BLOB NOT NULL, piece INTEGER NOT NULL, gen INTEGER NOT NULL,"
    " cid INTEGER NOT NULL, PRIMARY KEY (tensor_key, piece, gen)) WITHOUT ROWID",
    "INSERT INTO lineage3 SELECT l.tensor_key, l.piece, c.first_gen, l.cid FROM lineage l JOIN chunks c ON c.cid = l.cid",
    "DROP TABLE lineage",
    "ALTER TABLE lineage3 RENAME TO lineage",
    "CREATE INDEX lineage_cid ON lineage(cid)",
    "UPDATE meta SET value = 3 WHERE key = 'schema_version'",
)


def _count_nlinks(conn: sqlite3.Connection) -> None:
    """Set each directory version's nlink: 2 + its subdirectories as of its birth generation.
    Subdirectory entries are few; they are read once, grouped by parent."""
    subdirs: dict[int, list[tuple[int, int]]] = {}
    for parent, birth, death in conn.execute(
        "SELECT d.parent, d.birth_gen, d.death_gen FROM dentries d JOIN inodes i ON i.ino = d.ino WHERE i.kind = 2"
    ):
        subdirs.setdefault(parent, []).append((birth, death))
    rows = conn.execute("SELECT vid, ino, birth_gen FROM versions WHERE mode & 0xF000 = 0x4000").fetchall()
    conn.executemany("UPDATE versions SET nlink = ? WHERE vid = ?", [
        (2 + sum(1 for b, d in subdirs.get(ino, ()) if b <= gen < d), vid) for vid, ino, gen in rows
    ])


CATALOG_3_TO_4: tuple[str | Callable[[sqlite3.Connection], None], ...] = (
    "ALTER TABLE versions ADD COLUMN nlink INTEGER NOT NULL DEFAULT 1",
    _count_nlinks,
    "UPDATE meta SET value = 4 WHERE key = 'schema_version'",
)
CATALOG_4_TO_5 = (
    "ALTER TABLE versions ADD COLUMN atime_ns INTEGER NOT NULL DEFAULT 0",
    "UPDATE versions SET atime_ns = mtime_ns",
    "ALTER TABLE versions ADD COLUMN rdev INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE versions ADD COLUMN xattrs BLOB",
    "UPDATE meta SET value = 5 WHERE key = 'schema_version'",
)
CATALOG_5_TO_6 = (
    "UPDATE meta SET value = 6 WHERE key = 'schema_version'",
)
CATALOG_6_TO_7 = (
    "UPDATE meta SET value = 7 WHERE key = 'schema_version'",
)
# schema version -> the statements (or functions of the connection) that bring it to the next
STEPS: dict[int, Sequence[str | Callable[[sqlite3.Connection], None]]] = {
    1: CATALOG_1_TO_2, 2: CATALOG_2_TO_3, 3: CATALOG_3_TO_4, 4: CATALOG_4_TO_5, 5: CATALOG_5_TO_6, 6: CATALOG_6_TO_7,
}


def upgrade(root: Path) -> tuple[int, int]:
    """Upgrade the store at `root`; returns (version before, version after)."""
    path = root / CONFIG_FILE
    data = config_data(root)
    version = data.get("format_version")
    if version == FORMAT_VERSION:
        return version, version
    if not isinstance(version, int) or not OLDEST_UPGRADABLE <= version < FORMAT_VERSION:
        raise StoreError(f"{root}: store format version {version} cannot be upgraded by this cowfs "
                         f"(it upgrades {OLDEST_UPGRADABLE}..{FORMAT_VERSION - 1} to {FORMAT_VERSION})")
    fd = os.open(root / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise Busy(f"{root}: store is mounted or in use; unmount it first") from None
        _upgrade_catalog(root / CATALOG_FILE)
        data["format_version"] = FORMAT_VERSION
        tmp = root / (CONFIG_FILE + ".tmp")
        with open(tmp, "w") as f:
            f.write(json.dumps(data, indent=2) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, path)
        fsync_dir(root)
    finally:
        os.close(fd)
    return version, FORMAT_VERSION


def _upgrade_catalog(path: Path) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA synchronous = FULL")
        row = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        schema = int(row[0]) if row else None
        if schema == SCHEMA_VERSION:
            return  # done by an upgrade that stopped before rewriting the config
        if schema not in STEPS:
            raise StoreError(f"{path}: catalog schema version {schema} cannot be upgraded")
        conn.execute("BEGIN IMMEDIATE")
        while schema != SCHEMA_VERSION:
            for stmt in STEPS[schema]:
                if callable(stmt):
                    stmt(conn)
                else:
                    conn.execute(stmt)
            schema += 1
        conn.execute("COMMIT")
    except sqlite3.DatabaseError as e:
        raise StoreError(f"{path}: catalog cannot be upgraded ({e})") from None
    finally:
        conn.close()
