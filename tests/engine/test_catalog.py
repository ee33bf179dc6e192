"""The catalog's writer thread (store/catalog/db.py): changes waiting together share one
transaction (group commit), each with its own generation; a failing change is undone alone."""
from __future__ import annotations

import sqlite3
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from cowfs.store.catalog import db as db_module
from cowfs.store.catalog.db import PROTOCOL_TRIES, Catalog, Txn, create_catalog


@pytest.fixture
def catalog(tmp_path: Path):
    path = tmp_path / "catalog.db"
    create_catalog(path, str(uuid.uuid4()))
    c = Catalog(path)
    c.write(lambda txn: txn.execute("CREATE TABLE notes (gen INTEGER PRIMARY KEY, who TEXT)"), op="setup")
    yield c
    c.close()


def note(who: str):  # type: ignore[no-untyped-def]
    def fn(txn: Txn) -> int:
        txn.execute("INSERT INTO notes VALUES (?, ?)", (txn.gen, who))
        return txn.gen
    return fn


def test_concurrent_changes_each_get_a_generation(catalog: Catalog) -> None:
    with ThreadPoolExecutor(16) as pool:
        gens = list(pool.map(lambda i: catalog.write(note(f"w{i}"), op="note"), range(400)))
    assert len(set(gens)) == 400
    rows = catalog.read(lambda conn: conn.execute("SELECT gen, who FROM notes").fetchall())
    assert sorted(g for g, _ in rows) == sorted(gens)
    first = min(gens)
    assert sorted(gens) == list(range(first, first + 400))  # no generation skipped
    logged = catalog.read(lambda conn: conn.execute("SELECT gen FROM generations WHERE op='note'").fetchall())
    assert sorted(g for (g,) in logged) == sorted(gens)


def test_changes_waiting_together_commit_once(catalog: Catalog) -> None:
    """Three changes queued behind a busy writer share one COMMIT (one WAL fsync): the
    writer connection's statements, traced, hold one COMMIT for the three."""
    gate, held = threading.Event(), threading.Event()
    statements: list[str] = []

    def block(_conn: object) -> None:
        held.set()
        gate.wait(60)

    catalog.on_writer(lambda conn: conn.set_trace_callback(statements.append))
    with ThreadPoolExecutor(4) as pool:
        blocker = pool.submit(catalog.on_writer, block)
        assert held.wait(60)
        futs = [pool.submit(catalog.write, note(w), "note") for w in ("a", "b", "c")]
        until = time.monotonic() + 60
        while catalog._queue.qsize() < 3 and time.monotonic() < until:
            time.sleep(0.01)
        assert catalog._queue.qsize() == 3
        gate.set()
        blocker.result(60)
        gens = sorted(f.result(60) for f in futs)
    catalog.on_writer(lambda conn: conn.set_trace_callback(None))
    assert gens == [gens[0], gens[0] + 1, gens[0] + 2]
    assert sum(s.strip().upper() == "COMMIT" for s in statements) == 1
    assert sum(s.startswith("INSERT INTO notes") for s in statements) == 3


def test_a_failing_change_in_a_group_is_undone_alone(catalog: Catalog) -> None:
    gate, held = threading.Event(), threading.Event()

    def block(_conn: object) -> None:  # keeps the writer busy while the group queues up
        held.set()
        gate.wait(60)

    def fails(txn: Txn) -> int:
        txn.execute("INSERT INTO notes VALUES (?, ?)", (txn.gen, "bad"))
        raise ValueError("this change fails")

    with ThreadPoolExecutor(8) as pool:
        blocker = pool.submit(catalog.on_writer, block)
        assert held.wait(60)
        futs = [pool.submit(catalog.write, note("a"), "note"), pool.submit(catalog.write, fails, "note"),
                pool.submit(catalog.write, note("b"), "note")]
        until = time.monotonic() + 60
        while catalog._queue.qsize() < 3 and time.monotonic() < until:  # all three wait behind the blocker
            time.sleep(0.01)
        assert catalog._queue.qsize() == 3
        gate.set()
        blocker.result(60)
        a = futs[0].result(60)
        with pytest.raises(ValueError, match="fails"):
            futs[1].result(60)
        b = futs[2].result(60)
    rows = dict(catalog.read(lambda conn: conn.execute("SELECT who, gen FROM notes").fetchall()))
    assert rows == {"a": a, "b": b}  # "bad" was rolled back, and its generation given to "b"
    assert b == a + 1


CHILD = r"""
import sys, threading
from pathlib import Path
from cowfs.store.catalog.db import Catalog
c = Catalog(Path(sys.argv[1]))
lock = threading.Lock()

def writer(w):
    for i in range(100000):
        def fn(txn, w=w, i=i):
            txn.execute("INSERT INTO notes VALUES (?, ?)", (txn.gen, f"{w}-{i}"))
            return txn.gen
        gen = c.write(fn, op="note")
        with lock:
            sys.stdout.write(f"{gen}\n")
            sys.stdout.flush()

for w in range(8):
    threading.Thread(target=writer, args=(w,), daemon=True).start()
threading.Event().wait()
"""


def test_a_kill_during_group_commits_keeps_every_change_that_returned(tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys

    path = tmp_path / "catalog.db"
    create_catalog(path, str(uuid.uuid4()))
    c = Catalog(path)
    c.write(lambda txn: txn.execute("CREATE TABLE notes (gen INTEGER PRIMARY KEY, who TEXT)"), op="setup")
    c.close()
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(path)], stdout=subprocess.PIPE, text=True,
                             cwd=Path(__file__).parents[2])
    returned: list[int] = []
    assert child.stdout is not None
    for line in child.stdout:  # until 300 changes have returned: the writers are in full flow
        returned.append(int(line))
        if len(returned) >= 300:
            break
    os.kill(child.pid, signal.SIGKILL)
    child.wait(60)
    returned += [int(x) for x in child.stdout.read().split()]
    c = Catalog(path)
    try:
        notes = dict(c.read(lambda conn: conn.execute("SELECT gen, who FROM notes").fetchall()))
        gens = [g for (g,) in c.read(lambda conn: conn.execute("SELECT gen FROM generations WHERE op='note'").fetchall())]
        top = c.read(lambda conn: conn.execute("SELECT value FROM meta WHERE key='generation'").fetchone()[0])
    finally:
        c.close()
    assert set(returned) <= set(notes)  # every change whose caller returned is there
    assert sorted(notes) == sorted(gens)  # each with its generation row, nothing half done
    assert int(top) == max(gens) and sorted(gens) == list(range(min(gens), max(gens) + 1))


def test_close_right_behind_a_group_ends_the_writer(tmp_path: Path) -> None:
    path = tmp_path / "catalog.db"
    create_catalog(path, str(uuid.uuid4()))
    c = Catalog(path)
    c.write(lambda txn: txn.execute("CREATE TABLE notes (gen INTEGER PRIMARY KEY, who TEXT)"), op="setup")
    gate, held = threading.Event(), threading.Event()

    def block(_conn: object) -> None:
        held.set()
        gate.wait(60)

    with ThreadPoolExecutor(4) as pool:
        blocker = pool.submit(c.on_writer, block)
        assert held.wait(60)
        writes = [pool.submit(c.write, note(w), "note") for w in ("a", "b")]
        until = time.monotonic() + 60
        while c._queue.qsize() < 2 and time.monotonic() < until:
            time.sleep(0.01)
        closer = threading.Thread(target=c.close)  # its stop mark queues right behind the group
        closer.start()
        until = time.monotonic() + 60
        while c._queue.qsize() < 3 and time.monotonic() < until:
            time.sleep(0.01)
        gate.set()
        blocker.result(60)
        assert [w.result(60) for w in writes]
        closer.join(60)
        assert not closer.is_alive()  # the writer saw the stop mark taken while gathering the group


def _traced(catalog: Catalog, fn) -> list[str]:  # type: ignore[no-untyped-def]
    statements: list[str] = []
    catalog.on_writer(lambda conn: conn.set_trace_callback(statements.append))
    try:
        fn()
    finally:
        catalog.on_writer(lambda conn: conn.set_trace_callback(None))
    return [s.strip() for s in statements]


def test_a_lazy_change_skips_the_fsync_and_make_durable_adds_one(catalog: Catalog) -> None:
    """A change written with durable=False commits under synchronous = NORMAL (no WAL fsync),
    the connection goes back to FULL, and make_durable then commits a durable change (a WAL
    frame, fsynced under FULL) unless a durable commit came after it."""
    wal = catalog.path.with_name(catalog.path.name + "-wal")
    traced = _traced(catalog, lambda: catalog.write(note("lazy"), op="note", durable=False))
    assert traced[0] == "PRAGMA synchronous = NORMAL" and traced[-1] == "PRAGMA synchronous = FULL"
    assert catalog.on_writer(lambda conn: conn.execute("PRAGMA synchronous").fetchone()[0]) == 2  # FULL
    seq = catalog.lazy_seq
    assert seq >= 1 and catalog.durable_seq < seq
    size = wal.stat().st_size
    traced = _traced(catalog, lambda: catalog.make_durable(seq))
    assert any(s.startswith("INSERT OR REPLACE INTO meta") for s in traced) and "PRAGMA synchronous = NORMAL" not in traced
    assert catalog.durable_seq >= seq and wal.stat().st_size > size  # a frame was written and synced
    # covered already: nothing more to do
    assert _traced(catalog, lambda: catalog.make_durable(seq)) == []
    catalog.write(note("lazy2"), op="note", durable=False)
    seq2 = catalog.lazy_seq
    catalog.write(note("durable"), op="note")  # a durable commit covers every earlier lazy one
    assert catalog.durable_seq >= seq2
    assert _traced(catalog, lambda: catalog.make_durable(seq2)) == []
    rows = catalog.read(lambda conn: conn.execute("SELECT who FROM notes ORDER BY gen").fetchall())
    assert [w for (w,) in rows] == ["lazy", "lazy2", "durable"]


def test_a_group_with_one_durable_change_is_durable(catalog: Catalog) -> None:
    gate, held = threading.Event(), threading.Event()

    def block(_conn: object) -> None:
        held.set()
        gate.wait(60)

    def run() -> None:
        with ThreadPoolExecutor(4) as pool:
            blocker = pool.submit(catalog.on_writer, block)
            assert held.wait(60)
            futs = [pool.submit(catalog.write, note(w), "note", w != "b") for w in ("a", "b", "c")]
            until = time.monotonic() + 60
            while catalog._queue.qsize() < 3 and time.monotonic() < until:
                time.sleep(0.01)
            gate.set()
            blocker.result(60)
            [f.result(60) for f in futs]

    before = catalog.lazy_seq
    traced = _traced(catalog, run)
    assert sum(s.upper() == "COMMIT" for s in traced) == 1
    assert "PRAGMA synchronous = NORMAL" not in traced  # "a" and "c" are durable: so is the group
    assert catalog.lazy_seq == before and catalog.durable_seq == catalog.lazy_seq


def test_a_submitted_change_commits_lazily_and_outcome_maps_its_errors(catalog: Catalog) -> None:
    """`submit` queues a change without waiting; `outcome` gives its result, or its error:
    the change's own (here SQLite's constraint error) as raised, rolled back alone."""
    fut = catalog.submit(note("async"), "note", durable=False)
    gen = catalog.outcome(wait(fut))
    assert catalog.lazy_seq >= 1 and catalog.durable_seq < catalog.lazy_seq  # lazy: not yet fsynced
    dup = catalog.submit(lambda txn: txn.execute("INSERT INTO notes VALUES (?, 'again')", (gen,)), "note", durable=False)
    with pytest.raises(sqlite3.IntegrityError):
        catalog.outcome(wait(dup))
    rows = catalog.read(lambda conn: conn.execute("SELECT gen, who FROM notes").fetchall())
    assert rows == [(gen, "async")]
    with pytest.raises(AssertionError):
        catalog.submit(note("x"), "gc")  # changes that free space go through write (they retry when full)


def wait(fut):  # type: ignore[no-untyped-def]
    fut.exception(timeout=60)
    return fut


def test_a_new_catalog_is_made_again_when_sqlite_gives_up_a_wal_lock(tmp_path, monkeypatch):
    """SQLITE_PROTOCOL ("locking protocol") from a new catalog's COMMIT on a loaded machine:
    the half-made file is removed and the catalog made again; other errors are not retried."""
    real_connect = sqlite3.connect
    failures = {"left": 2, "seen": 0}

    class Loaded(sqlite3.Connection):
        def execute(self, sql, *args):  # type: ignore[no-untyped-def, override]
            if sql == "COMMIT" and failures["left"]:
                failures["left"] -= 1
                failures["seen"] += 1
                e = sqlite3.OperationalError("locking protocol")
                e.sqlite_errorcode = sqlite3.SQLITE_PROTOCOL  # type: ignore[attr-defined]
                raise e
            return super().execute(sql, *args)

    monkeypatch.setattr(db_module.sqlite3, "connect", lambda *a, **k: real_connect(*a, factory=Loaded, **k))
    path = tmp_path / "catalog.db"
    create_catalog(path, str(uuid.uuid4()))
    monkeypatch.setattr(db_module.sqlite3, "connect", real_connect)
    assert failures["seen"] == 2
    cat = Catalog(path)
    try:
        assert cat.read(lambda c: c.execute("SELECT COUNT(*) FROM inodes").fetchone()[0]) == 1  # the root, once
    finally:
        cat.close()

    failures["left"] = PROTOCOL_TRIES  # every try fails: the error is the caller's
    monkeypatch.setattr(db_module.sqlite3, "connect", lambda *a, **k: real_connect(*a, factory=Loaded, **k))
    with pytest.raises(sqlite3.OperationalError, match="locking protocol"):
        create_catalog(tmp_path / "other.db", str(uuid.uuid4()))
