"""The catalog connection: one read-write SQLite connection owned by one writer thread.

Writes run as `Catalog.write(fn)`: fn(txn) executes on the writer thread inside
BEGIN IMMEDIATE ... COMMIT, so a multi-step change is one transaction. Group commit:
changes waiting together (up to GROUP_MAX) share one transaction and so one fsync of
the WAL, each inside its own SAVEPOINT with its own generation; a change that fails is
rolled back to its savepoint alone, and each caller returns once the COMMIT is durable.
Reads from any thread use that thread's own read-only connection (WAL readers never
wait for the writer).
"""
from __future__ import annotations

import os
import queue
import sqlite3
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Callable, TypeVar

from ... import _native
from ...errors import CorruptCatalog, NoSpace, StoreError
from .schema import KIND_DIR, LIVE, ROOT_INO, SCHEMA, SCHEMA_VERSION

T = TypeVar("T")
GROUP_MAX = 64  # changes committed in one transaction at most


class _Change:
    """A `Catalog.write` waiting for the writer thread."""

    def __init__(self, fn: Callable[["Txn"], Any], op: str, durable: bool = True) -> None:
        self.fn, self.op, self.durable, self.future = fn, op, durable, Future()  # type: Future[Any]


def _connect(path: Path, readonly: bool) -> sqlite3.Connection:
    uri = f"file:{path}?mode={'ro' if readonly else 'rw'}"
    conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False, timeout=60)
    conn.execute("PRAGMA busy_timeout = 60000")
    if not readonly:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("PRAGMA foreign_keys = OFF")
    return conn


def damaged(path: Path, e: sqlite3.DatabaseError) -> CorruptCatalog | None:
    """The engine's error for SQLite's "malformed" and "not a database" (None for any other error)."""
    if (getattr(e, "sqlite_errorcode", 0) or 0) & 0xFF in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB):
        return CorruptCatalog(f"{path}: the catalog is damaged ({e})")
    return None


class Txn:
    """One write transaction; allocates the next generation on first use."""

    def __init__(self, conn: sqlite3.Connection, op: str) -> None:
        self.conn = conn
        self.op = op
        self.now_ns = time.time_ns()
        self._gen: int | None = None

    @property
    def gen(self) -> int:
        if self._gen is None:
            cur = self.conn.execute("SELECT value FROM meta WHERE key='generation'").fetchone()[0]
            self._gen = int(cur) + 1
        return self._gen

    def execute(self, sql: str, args: tuple | list = ()) -> sqlite3.Cursor:
        return self.conn.execute(sql, args)

    def finish(self) -> None:
        if self._gen is not None:
            self.conn.execute("UPDATE meta SET value=? WHERE key='generation'", (self._gen,))
            self.conn.execute(
                "INSERT INTO generations(gen, time_ns, op) VALUES (?,?,?)", (self._gen, self.now_ns, self.op)
            )


def one_transaction(conn: sqlite3.Connection, fn: Callable[[Txn], T], op: str, durable: bool = True) -> T:
    """fn(txn) in BEGIN IMMEDIATE ... COMMIT; rolled back if it raises. Not `durable`: the
    COMMIT does not fsync the WAL (synchronous = NORMAL for it): the next durable commit does."""
    txn = Txn(conn, op)
    if not durable:
        conn.execute("PRAGMA synchronous = NORMAL")
    try:
        conn.execute("BEGIN IMMEDIATE")
        try:
            result = fn(txn)
            txn.finish()
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
    finally:
        if not durable:
            conn.execute("PRAGMA synchronous = FULL")
    return result


# SQLite gives up on a WAL lock it could not take in ~100 tries (about 10 s) as SQLITE_PROTOCOL
# ("locking protocol"): under contention that is a busy condition, and SQLite's answer is to try
# again. Any other error (a descriptor of SQLite's closed under it: "disk I/O error") is raised.
PROTOCOL_TRIES = 5


def create_catalog(path: Path, store_uuid: str) -> None:
    """A new catalog file at `path` (nothing there yet): the schema and the root directory."""
    for attempt in range(1, PROTOCOL_TRIES + 1):
        try:
            _create_catalog(path, store_uuid)
            return
        except sqlite3.OperationalError as e:
            if getattr(e, "sqlite_errorcode", None) != sqlite3.SQLITE_PROTOCOL or attempt == PROTOCOL_TRIES:
                raise
            for suffix in ("", "-wal", "-shm"):  # a half-made catalog: start it again
                Path(f"{path}{suffix}").unlink(missing_ok=True)


def _create_catalog(path: Path, store_uuid: str) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("BEGIN")
        for stmt in SCHEMA.split(";"):
            if stmt.strip():
                conn.execute(stmt)
        now = time.time_ns()
        conn.executemany(
            "INSERT INTO meta(key, value) VALUES (?,?)",
            [("schema_version", SCHEMA_VERSION), ("store_uuid", store_uuid), ("generation", 1), ("next_segment", 1)],
        )
        conn.execute("INSERT INTO generations VALUES (1, ?, 'init')", (now,))
        conn.execute("INSERT INTO inodes VALUES (?, ?, 1)", (ROOT_INO, KIND_DIR))
        uid, gid = os.getuid(), os.getgid()
        conn.execute(
            "INSERT INTO versions(ino, birth_gen, death_gen, size, mode, uid, gid, mtime_ns, ctime_ns, data_gen, nlink)"
            " VALUES (?, 1, ?, 0, ?, ?, ?, ?, ?, 1, 2)",
            (ROOT_INO, LIVE, 0o40755, uid, gid, now, now),
        )
        conn.execute("COMMIT")
    finally:
        conn.close()


def rebuild_catalog(path: Path, dest: Path) -> str | None:
    """Copy every row of the catalog at `path` into a new catalog at `dest` whose indexes are
    built afresh from the rows (fsck --repair of damaged index pages). Tables are read
    without their indexes. Returns None when `dest` is complete, or why it could not be
    (a damaged table); then `dest` is removed."""
    dest.unlink(missing_ok=True)
    conn = sqlite3.connect(f"file:{dest}", uri=True, isolation_level=None)
    why: str | None = None
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("ATTACH ? AS old", (f"file:{path}?mode=ro",))
        conn.execute("BEGIN")
        for stmt in SCHEMA.split(";"):
            if stmt.strip():
                conn.execute(stmt)
        for name, sql in conn.execute("SELECT name, sql FROM main.sqlite_schema WHERE type='table'").fetchall():
            why = _copy_table(conn, name, sql)
            if why is not None:
                break
        if why is None:
            result = conn.execute("PRAGMA main.integrity_check").fetchone()[0]
            why = None if result == "ok" else f"the copy fails its check: {result}"
        conn.execute("COMMIT" if why is None else "ROLLBACK")
    except sqlite3.DatabaseError as e:
        why = str(e)
    finally:
        conn.close()
        if why is not None:
            for f in (dest, dest.with_name(dest.name + "-wal"), dest.with_name(dest.name + "-shm")):
                f.unlink(missing_ok=True)
    return why


def _copy_table(conn: sqlite3.Connection, name: str, sql: str) -> str | None:
    order = ""
    if "WITHOUT ROWID" in sql.upper():  # scan the table's own b-tree, not a covering index
        pk = sorted((r[5], r[1]) for r in conn.execute(f"PRAGMA main.table_info({name})") if r[5])
        order = " ORDER BY " + ", ".join(col for _, col in pk)
    try:  # WHERE 1 keeps SQLite from copying the old b-trees page by page (indexes too)
        conn.execute(f"INSERT INTO main.{name} SELECT * FROM old.{name} NOT INDEXED WHERE 1{order}")
    except sqlite3.DatabaseError as e:
        return f"table {name}: {e}"
    return None


RESERVE_SUFFIX = ".reserve"
RESERVE_MIN, RESERVE_MAX = 1 << 20, 64 << 20  # the reserve's bounds (reserve_size)
# changes that give space back, or that a user makes to give it back (delete a snapshot or a
# file, expire history): on a full device they may use the reserve
FREEING_OPS = frozenset({"gc", "expire", "snapshot-delete", "unlink", "rmdir", "repair"})


def reserve_size(catalog_bytes: int, device_bytes: int) -> int:
    """Room a freeing transaction may need: twice the catalog (its WAL frames for every page it
    touches, and the pages it adds), at least 1 MiB, at most 64 MiB and at most 1% of the
    device unless that is under 1 MiB. It grows with the catalog: open and gc refill it."""
    return min(max(2 * catalog_bytes, RESERVE_MIN), max(device_bytes // 100, RESERVE_MIN), RESERVE_MAX)


class Catalog:
    """The SQLite catalog. Beside it lies `catalog.db.reserve` (`reserve_size`), allocated
    while there is room: when the device is full, a change that frees space (FREEING_OPS) that fails
    for lack of room gives the reserve back to the file system and is tried once more, so a
    full store can always be pruned; gc allocates the reserve again (`refill_reserve`)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.reserve = path.with_name(path.name + RESERVE_SUFFIX)
        if not path.is_file():
            raise StoreError(f"{path.parent}: catalog {path.name} is missing")
        if not os.access(path, os.R_OK | os.W_OK):  # SQLite would open it read-only and fail at the first write
            raise StoreError(f"{path}: permission denied (the catalog must be readable and writable)")
        self._queue: queue.SimpleQueue[tuple[Callable[[], Any], Future] | _Change | None] = queue.SimpleQueue()
        self._local = threading.local()
        self._readers: list[sqlite3.Connection] = []
        self._readers_lock = threading.Lock()
        # commits that did not fsync the WAL (written by the writer thread only): how many, and
        # how many of them a durable commit made durable since
        self.lazy_seq = 0
        self.durable_seq = 0
        conn: sqlite3.Connection | None = None
        try:
            conn = _connect(path, readonly=False)
            version = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        except sqlite3.DatabaseError as e:
            if conn is not None:
                conn.close()
            raise damaged(path, e) or StoreError(f"{path}: catalog is unreadable ({e})") from None
        self._conn = conn
        if version is None or int(version[0]) != SCHEMA_VERSION:
            self._conn.close()
            raise StoreError(f"{path}: catalog schema version {version and version[0]} is not supported")
        self._thread = threading.Thread(target=self._run, name="cowfs-catalog", daemon=True)
        self._thread.start()
        self.refill_reserve()

    def refill_reserve(self) -> bool:
        """Allocate the reserve if it is missing or short and there is room; True if it is whole."""
        try:
            fd = os.open(self.reserve, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError:
            return False
        try:
            st = os.statvfs(self.reserve)
            want = reserve_size(self.path.stat().st_size, st.f_blocks * st.f_frsize)
            if os.fstat(fd).st_blocks * 512 >= want:
                return True
            os.posix_fallocate(fd, 0, want)
            os.fsync(fd)
            return True
        except OSError:  # no room (yet): keep what is allocated
            return False
        finally:
            os.close(fd)

    def _release_reserve(self) -> bool:
        try:
            self.reserve.unlink()
            return True
        except FileNotFoundError:
            return False

    # -- writer thread ------------------------------------------------------

    def _run(self) -> None:
        _native.name_thread("cowfs-catalog")
        pending: list[Any] = []  # an item taken while gathering a group, to be run next
        while True:
            item = pending.pop() if pending else self._queue.get()
            if item is None:  # close()
                break
            if isinstance(item, _Change):
                group = [item]
                while len(group) < GROUP_MAX:  # the changes waiting now join this transaction
                    try:
                        nxt = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if not isinstance(nxt, _Change):
                        pending.append(nxt)  # (None included: close after this group)
                        break
                    group.append(nxt)
                self._commit_group(group)
                continue
            fn, fut = item
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn())
                except BaseException as e:  # delivered to the caller
                    fut.set_exception(e)
        self._conn.close()

    def _commit_group(self, group: list[_Change]) -> None:
        """Run the changes in one transaction, each in a savepoint (a failing one is undone
        alone); their callers learn the outcome once COMMIT returned (durable), or all learn
        the error if the transaction itself fails (then none of them happened)."""
        live = [c for c in group if c.future.set_running_or_notify_cancel()]
        conn = self._conn
        durable = any(c.durable for c in live)
        if len(live) == 1:  # alone: a plain transaction, no savepoint to pay for
            try:
                result = one_transaction(conn, live[0].fn, live[0].op, durable)
                self._committed(durable)
                live[0].future.set_result(result)
            except BaseException as e:
                live[0].future.set_exception(e)
            return
        outcomes: list[tuple[bool, Any]] = []
        if not durable:
            conn.execute("PRAGMA synchronous = NORMAL")
        try:
            conn.execute("BEGIN IMMEDIATE")
            for c in live:
                conn.execute("SAVEPOINT change")
                txn = Txn(conn, c.op)
                try:
                    result = c.fn(txn)
                    txn.finish()
                    conn.execute("RELEASE change")
                    outcomes.append((True, result))
                except BaseException as e:
                    conn.execute("ROLLBACK TO change")
                    conn.execute("RELEASE change")
                    outcomes.append((False, e))
            conn.execute("COMMIT")
            self._committed(durable)
        except BaseException as e:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            for c in live:
                c.future.set_exception(e)
            return
        finally:
            if not durable:
                conn.execute("PRAGMA synchronous = FULL")
        for c, (ok, value) in zip(live, outcomes):
            if ok:
                c.future.set_result(value)
            else:
                c.future.set_exception(value)

    def _committed(self, durable: bool) -> None:
        """(writer thread) A commit returned: a durable one covers every earlier one (the WAL
        is one file, fsynced whole)."""
        if durable:
            self.durable_seq = self.lazy_seq
        else:
            self.lazy_seq += 1

    def make_durable(self, seq: int) -> None:
        """Return once the lazy commit numbered `seq` (a `lazy_seq` read after it) is durable:
        at once if a durable commit came after it, else after a durable commit of its own."""
        if self.durable_seq >= seq:
            return
        # a real change (SQLite writes no WAL frame for a row rewritten unchanged), fsynced as any durable commit
        self.write(lambda txn: txn.execute("INSERT OR REPLACE INTO meta VALUES ('synced_ns', ?)", (txn.now_ns,)), op="sync")

    def _submit(self, fn: Callable[[], T]) -> T:
        if threading.current_thread() is self._thread:
            return fn()
        fut: Future = Future()
        self._queue.put((fn, fut))
        return fut.result()

    def write(self, fn: Callable[[Txn], T], op: str, durable: bool = True) -> T:
        """Run fn(txn) as one transaction on the writer thread; bump the generation if it changed
        anything. Not `durable`: returns once committed, before the WAL is fsynced (a crash may
        lose it, never half of it); the next durable commit, or `make_durable`, makes it durable."""

        for attempt in (1, 2):
            try:
                if threading.current_thread() is self._thread:
                    result = one_transaction(self._conn, fn, op)
                    self._committed(True)
                    return result
                change = _Change(fn, op, durable)
                self._queue.put(change)
                return change.future.result()
            except sqlite3.DatabaseError as e:
                # a full device rolled the change back: one that frees space gets the reserve and one more try
                if (getattr(e, "sqlite_errorcode", None) != sqlite3.SQLITE_FULL or attempt == 2
                        or op not in FREEING_OPS or not self._release_reserve()):
                    raise self._error(e) from None
        raise AssertionError("unreachable")

    def _error(self, e: sqlite3.DatabaseError) -> Exception:
        """The engine's error for a failed change: NoSpace for a full device, CorruptCatalog for
        a damaged catalog, else SQLite's own."""
        if getattr(e, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL:
            return NoSpace(f"{self.path}: no space left on device for the catalog")
        return damaged(self.path, e) or e

    def submit(self, fn: Callable[[Txn], T], op: str, durable: bool = True) -> "Future[T]":
        """`write` without waiting, for a caller that must not block (the FUSE thread): the
        change is queued for the writer thread, and `outcome(future)` gives its result once
        the future is done. Not for changes that free space (no retry on a full device)."""
        assert op not in FREEING_OPS and threading.current_thread() is not self._thread
        change = _Change(fn, op, durable)
        self._queue.put(change)
        return change.future

    def outcome(self, future: "Future[T]") -> T:
        """The result of a done `submit`, its SQLite errors mapped as `write` maps them."""
        try:
            return future.result()
        except sqlite3.DatabaseError as e:
            raise self._error(e) from None

    def on_writer(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run fn(conn) on the writer thread without opening a transaction."""
        return self._submit(lambda: fn(self._conn))

    # -- readers ------------------------------------------------------------

    def reader(self) -> sqlite3.Connection:
        """This thread's read-only connection."""
        if threading.current_thread() is self._thread:
            return self._conn
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = _connect(self.path, readonly=True)
            self._local.conn = conn
            with self._readers_lock:
                self._readers.append(conn)
        return conn

    def read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """fn(conn) inside one read transaction: a consistent view of one generation."""
        conn = self.reader()
        if conn.in_transaction:
            return fn(conn)
        try:
            conn.execute("BEGIN")
            try:
                return fn(conn)
            finally:
                conn.execute("COMMIT")
        except sqlite3.DatabaseError as e:
            raise damaged(self.path, e) or e from None

    def close(self) -> None:
        with self._readers_lock:  # readers first: the writer, closing last, checkpoints and removes the WAL
            for conn in self._readers:
                try:
                    conn.close()
                except sqlite3.Error:
                    pass
            self._readers.clear()
        self._queue.put(None)
        self._thread.join()
