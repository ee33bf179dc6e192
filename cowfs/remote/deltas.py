"""Catalog objects sent as the rows changed since the last one (docs/design.md section 17,
"Catalog deltas"; docs/format.md section 9.4).

The change log. The first pass of a store with a remote installs into `catalog.db` a table
`remote_changes` and, on every other table, triggers that append the primary key of each
row inserted, updated or deleted, with a sequence number (AUTOINCREMENT: never reused);
`remote_changes_epoch` holds a random id of the installation. A *mark* (epoch, seq) taken
in the same read transaction as a catalog's rows says which changes that catalog covers.
`cowfs remote unset` removes both tables and the triggers.

A delta from generation F to G is a SQLite database with every table of the catalog (the
same CREATE statements), holding the rows, as of G, of every key logged after F's mark up
to G's, plus the chunk rows the delta's extents use and the delta bases those decode from
(so a receiver can point them at packs); `delta_keys` lists the logged keys and
`delta_meta` what the delta is. A receiver holding F deletes, per table, the rows whose key
is in `delta_keys` or in the delta's table, then inserts the delta's rows: the result is G.
"""
from __future__ import annotations

import re
import sqlite3
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import RemoteError, StoreError
from ..store.log.layout import CATALOG_FILE

if TYPE_CHECKING:
    from ..store import Store

CHANGES = "remote_changes"
EPOCH = "remote_changes_epoch"
TRIGGER = "remote_changes_"  # prefix of the triggers' names
DELTA_FORMAT = "cowfs-catalog-delta"
DELTA_VERSION = 1
MAX_KEY = 3  # primary-key columns a catalog table has at most
_DELTA_KEY = re.compile(r"^(\d{16})\.from-(\d{16})\.delta\.zst$")
# chunks a delta's extents use, with the delta bases they decode from (gc's recursive rule)
_USED = ("WITH RECURSIVE keep(cid) AS (SELECT cid FROM d.extents WHERE cid IS NOT NULL"
         " UNION SELECT c.base_cid FROM main.chunks c JOIN keep k ON c.cid = k.cid WHERE c.base_cid IS NOT NULL)")


@dataclass(frozen=True)
class Mark:
    """Where the change log stood when a catalog's rows were read."""
    epoch: str
    seq: int


@dataclass
class Taken:
    """One consistent read of the catalog by `take`."""
    generation: int
    mark: Mark | None  # None: no change log installed
    delta_rows: int = 0  # keys the delta holds (-1: no delta made)
    needs: list[tuple[bytes, int]] | None = None  # the delta's: (hash, stored_len) its extents use, log order


def delta_name(gen: int, from_gen: int) -> str:
    return f"{gen:016d}.from-{from_gen:016d}.delta.zst"


def parse_delta_name(name: str) -> tuple[int, int] | None:
    """(generation, from generation) of a delta object's last path part, else None."""
    m = _DELTA_KEY.match(name)
    return (int(m.group(1)), int(m.group(2))) if m else None


def catalog_tables(conn: sqlite3.Connection, schema: str = "main") -> list[tuple[str, str]]:
    """(name, CREATE statement) of the catalog's own tables, in creation order."""
    return [(str(n), str(s)) for n, s in conn.execute(
        f"SELECT name, sql FROM {schema}.sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%'"
        " AND name NOT LIKE 'remote_changes%' AND name NOT LIKE 'delta_%' AND name NOT LIKE 'replica_%'"
        " ORDER BY rowid")]


def key_columns(conn: sqlite3.Connection, table: str, schema: str = "main") -> list[str]:
    cols = sorted((int(pk), str(name)) for _, name, _, _, _, pk in conn.execute(f"PRAGMA {schema}.table_info({table})")
                  if int(pk))
    if not cols or len(cols) > MAX_KEY:
        raise StoreError(f"catalog table {table} has {len(cols)} primary-key columns; the change log takes 1 to {MAX_KEY}")
    return [c for _, c in cols]


def _trigger_sql(conn: sqlite3.Connection, table: str) -> list[str]:
    keys = key_columns(conn, table)

    def log(row: str) -> str:
        vals = [f"{row}.{k}" for k in keys] + ["NULL"] * (MAX_KEY - len(keys))
        return f"INSERT INTO {CHANGES}(tbl, k1, k2, k3) VALUES ('{table}', {', '.join(vals)});"

    moved = " OR ".join(f"OLD.{k} IS NOT NEW.{k}" for k in keys)
    return [f"CREATE TRIGGER {TRIGGER}{table}_i AFTER INSERT ON {table} BEGIN {log('NEW')} END",
            f"CREATE TRIGGER {TRIGGER}{table}_u AFTER UPDATE ON {table} BEGIN {log('NEW')} END",
            f"CREATE TRIGGER {TRIGGER}{table}_k AFTER UPDATE ON {table} WHEN {moved} BEGIN {log('OLD')} END",
            f"CREATE TRIGGER {TRIGGER}{table}_d AFTER DELETE ON {table} BEGIN {log('OLD')} END"]


def installed(conn: sqlite3.Connection) -> bool:
    """Is the change log there, with its triggers on every catalog table?"""
    names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE name LIKE 'remote_changes%'")}
    if CHANGES not in names or EPOCH not in names:
        return False
    return all(f"{TRIGGER}{t}_{s}" in names for t, _ in catalog_tables(conn) for s in "iukd")


def install(store: "Store") -> bool:
    """Install the change log (a new epoch) unless it is whole; True if it was installed."""
    if store.catalog.read(installed):
        return False

    def change(txn) -> None:  # type: ignore[no-untyped-def]
        _drop(txn.conn)
        txn.execute(f"CREATE TABLE {CHANGES} (seq INTEGER PRIMARY KEY AUTOINCREMENT, tbl TEXT NOT NULL, k1, k2, k3)")
        txn.execute(f"CREATE TABLE {EPOCH} (epoch TEXT NOT NULL)")
        txn.execute(f"INSERT INTO {EPOCH} VALUES (?)", (uuid.uuid4().hex,))
        for table, _ in catalog_tables(txn.conn):
            for sql in _trigger_sql(txn.conn, table):
                txn.execute(sql)

    store.catalog.write(change, op="remote-changes")
    return True


def _drop(conn: sqlite3.Connection) -> None:
    for (name,) in conn.execute(f"SELECT name FROM sqlite_master WHERE type='trigger' AND name LIKE '{TRIGGER}%'"
                                ).fetchall():
        conn.execute(f"DROP TRIGGER {name}")
    conn.execute(f"DROP TABLE IF EXISTS {CHANGES}")
    conn.execute(f"DROP TABLE IF EXISTS {EPOCH}")


def uninstall(store: "Store") -> None:
    """Remove the change log (`cowfs remote unset`): no trigger cost without a remote."""
    store.catalog.write(lambda txn: _drop(txn.conn), op="remote-changes")


def trim(store: "Store", mark: Mark) -> None:
    """Forget the changes a catalog object in the bucket covers (not fsynced: a crash only
    leaves rows the next trim deletes)."""
    def change(txn) -> None:  # type: ignore[no-untyped-def]
        row = txn.execute(f"SELECT epoch FROM {EPOCH}").fetchone()
        if row is not None and row[0] == mark.epoch:
            txn.execute(f"DELETE FROM {CHANGES} WHERE seq <= ?", (mark.seq,))
    store.catalog.write(change, op="remote-trim", durable=False)


def _mark(conn: sqlite3.Connection) -> Mark | None:
    try:
        (epoch,) = conn.execute(f"SELECT epoch FROM {EPOCH}").fetchone()
        seq = conn.execute(f"SELECT seq FROM sqlite_sequence WHERE name='{CHANGES}'").fetchone()
    except (sqlite3.OperationalError, TypeError):  # not installed
        return None
    return Mark(str(epoch), int(seq[0]) if seq else 0)


def take(store: "Store", since: tuple[int, Mark] | None, delta: Path | None, base: Path | None) -> Taken:
    """Read the catalog once (one read transaction): its generation and mark; with `delta`
    and `since` (a generation uploaded before and its mark) of the same epoch, the delta
    since then into that (new) file; with `base`, a whole copy into that file, without the
    change log."""
    src = sqlite3.connect(f"file:{store.root / CATALOG_FILE}?mode=ro", uri=True, isolation_level=None)
    try:
        src.execute("PRAGMA busy_timeout = 60000")
        if delta is not None:
            _create_delta(src, delta)
            src.execute("ATTACH DATABASE ? AS d", (f"file:{delta}?mode=rw",))
        src.execute("BEGIN")
        try:
            (gen,) = src.execute("SELECT value FROM meta WHERE key='generation'").fetchone()
            taken = Taken(int(gen), _mark(src), delta_rows=-1)
            if delta is not None and since is not None and taken.mark is not None \
                    and since[1].epoch == taken.mark.epoch and since[1].seq <= taken.mark.seq:
                _fill_delta(src, since[0], since[1], taken)
            if base is not None:
                dst = sqlite3.connect(base)
                try:
                    src.backup(dst)
                    _drop(dst)
                    dst.commit()
                finally:
                    dst.close()
        finally:
            src.execute("COMMIT")
    finally:
        src.close()
    return taken


def _create_delta(src: sqlite3.Connection, path: Path) -> None:
    dst = sqlite3.connect(path, isolation_level=None)
    try:
        dst.execute("PRAGMA journal_mode=OFF")
        dst.execute("BEGIN")
        for _, sql in catalog_tables(src):
            dst.execute(sql)
        dst.execute("CREATE TABLE delta_meta (key TEXT PRIMARY KEY, value NOT NULL) WITHOUT ROWID")
        dst.execute("CREATE TABLE delta_keys (tbl TEXT NOT NULL, k1, k2, k3)")
        dst.execute("COMMIT")
    finally:
        dst.close()


def _keys_of(table: str, cols: list[str], prefix: str = "") -> str:
    own = ", ".join(f"{prefix}{c}" for c in cols)
    logged = ", ".join(f"k{i + 1}" for i in range(len(cols)))
    return f"({own}) IN (SELECT {logged} FROM d.delta_keys WHERE tbl = '{table}')"


def _fill_delta(src: sqlite3.Connection, from_gen: int, since: Mark, taken: Taken) -> None:
    assert taken.mark is not None
    src.execute(f"INSERT INTO d.delta_keys SELECT DISTINCT tbl, k1, k2, k3 FROM main.{CHANGES}"
                " WHERE seq > ? AND seq <= ?", (since.seq, taken.mark.seq))
    for table, _ in catalog_tables(src):
        cols = key_columns(src, table)
        src.execute(f"INSERT INTO d.{table} SELECT * FROM main.{table} WHERE {_keys_of(table, cols)}")
    # the chunk rows the delta's extents use and their bases, changed or not: a receiver
    # points them at the packs that hold them (one a pass uploads now, maybe)
    src.execute(f"{_USED} INSERT OR IGNORE INTO d.chunks SELECT * FROM main.chunks WHERE cid IN (SELECT cid FROM keep)")
    src.executemany("INSERT INTO d.delta_meta VALUES (?, ?)", [
        ("format", DELTA_FORMAT), ("version", DELTA_VERSION), ("from_gen", from_gen), ("to_gen", taken.generation),
        ("store_uuid", store_uuid(src)), ("schema_version", schema_version(src)),
        ("from_epoch", since.epoch), ("from_seq", since.seq), ("to_seq", taken.mark.seq)])
    taken.delta_rows = int(src.execute("SELECT count(*) FROM d.delta_keys").fetchone()[0])
    taken.needs = [(bytes(h), int(n)) for h, n in src.execute(
        f"{_USED} SELECT hash, stored_len FROM main.chunks WHERE cid IN (SELECT cid FROM keep) ORDER BY seg_id, offset")]


def store_uuid(conn: sqlite3.Connection, schema: str = "main") -> str:
    return str(conn.execute(f"SELECT value FROM {schema}.meta WHERE key='store_uuid'").fetchone()[0])


def schema_version(conn: sqlite3.Connection, schema: str = "main") -> int:
    return int(conn.execute(f"SELECT value FROM {schema}.meta WHERE key='schema_version'").fetchone()[0])


def delta_meta(conn: sqlite3.Connection, schema: str = "d") -> dict[str, object]:
    try:
        return {str(k): v for k, v in conn.execute(f"SELECT key, value FROM {schema}.delta_meta")}
    except sqlite3.DatabaseError as e:
        raise RemoteError(f"not a catalog delta ({e})") from None


def apply_delta(conn: sqlite3.Connection, from_gen: int) -> int:
    """Apply the delta ATTACHed to `conn` as `d` to the catalog of generation `from_gen` open
    on `conn` (inside the caller's transaction); returns the new generation."""
    meta = delta_meta(conn)
    if meta.get("format") != DELTA_FORMAT or int(meta.get("version", 0)) != DELTA_VERSION:  # type: ignore[arg-type]
        raise RemoteError(f"not a catalog delta of version {DELTA_VERSION}")
    if int(meta["from_gen"]) != from_gen:  # type: ignore[arg-type]
        raise RemoteError(f"the delta starts from generation {meta['from_gen']}, not {from_gen}")
    if meta["store_uuid"] != store_uuid(conn) or int(meta["schema_version"]) != schema_version(conn):  # type: ignore[arg-type]
        raise RemoteError("the delta is of another store or catalog schema")
    for table, _ in catalog_tables(conn):
        cols = key_columns(conn, table)
        own = ", ".join(cols)
        conn.execute(f"DELETE FROM main.{table} WHERE {_keys_of(table, cols)}")
        conn.execute(f"DELETE FROM main.{table} WHERE ({own}) IN (SELECT {own} FROM d.{table})")
        conn.execute(f"INSERT INTO main.{table} SELECT * FROM d.{table}")
    gen = int(conn.execute("SELECT value FROM main.meta WHERE key='generation'").fetchone()[0])
    if gen != int(meta["to_gen"]):  # type: ignore[arg-type]
        raise RemoteError(f"the delta to generation {meta['to_gen']} gave generation {gen}")
    return gen
