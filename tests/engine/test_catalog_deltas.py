"""Catalog deltas (cowfs/remote/deltas.py): the change log's triggers, a delta read beside a
whole copy, and applying deltas one after another, checked against the whole catalog of the
same generation, table by table, over random sequences of changes (hypothesis)."""
from __future__ import annotations

import sqlite3
from pathlib import Path

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings

from cowfs.errors import RemoteError
from cowfs.remote import deltas
from cowfs.store import ROOT_INO, Store
from cowfs.store.log.layout import CATALOG_FILE
from tests.support.storeutil import assert_clean, data, new_store


def tables(path: Path) -> dict[str, list[str]]:
    conn = sqlite3.connect(path)
    try:
        return {t: sorted(map(repr, conn.execute(f"SELECT * FROM {t}"))) for t, _ in deltas.catalog_tables(conn)}
    finally:
        conn.close()


def apply(base: Path, delta: Path, from_gen: int) -> int:
    conn = sqlite3.connect(base, isolation_level=None)
    try:
        conn.execute("ATTACH DATABASE ? AS d", (str(delta),))
        conn.execute("BEGIN")
        gen = deltas.apply_delta(conn, from_gen)
        conn.execute("COMMIT")
        return gen
    finally:
        conn.close()


def change(s: Store, step: int, kind: int) -> None:
    """One change of the kinds a store sees; `step` makes names and bytes differ."""
    run = s.resolve("/run").ino
    names = [n for n, _ in s.readdir(run)]
    if kind == 0 or not names:
        s.write_file(f"/run/f{step % 4}.bin", data(70_000 + 1000 * step, step))
    elif kind == 1:
        s.rename(run, names[0], run, f"r{step}.bin".encode())
    elif kind == 2:
        s.unlink(run, names[-1])
    elif kind == 3:
        s.snapshot_create(f"snap{step}")
    elif kind == 4:
        for snap in s.snapshot_list()[:1]:
            s.snapshot_delete(snap.name)
        s.expire_history()
        s.gc()
    elif kind == 5:
        ino = s.resolve(b"/run/" + names[0]).ino
        s.setxattr(ino, b"user.step", str(step).encode())
        s.setattr(ino, mode=0o600 + step % 8)
    elif kind == 6:
        s.link(s.resolve(b"/run/" + names[0]).ino, run, f"l{step}.bin".encode())
    else:
        s.write_file(f"/run/f{step % 4}.bin", data(70_000 + 1000 * (step - 1), step - 1))  # bytes seen before


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.tuples(st.integers(0, 7), st.booleans()), min_size=1, max_size=14))
def test_deltas_applied_in_turn_give_the_whole_catalog(tmp_path_factory, steps):
    tmp = tmp_path_factory.mktemp("deltas")
    path = new_store(tmp / "s")
    with Store.open(path) as s:
        s.mkdir(ROOT_INO, b"run")
        s.write_file("/run/f0.bin", data(100_000, 99))
        deltas.install(s)
        first = deltas.take(s, None, None, tmp / "held.db")
        since = (first.generation, first.mark)
        for i, (kind, take_now) in enumerate(steps):
            change(s, i + 1, kind)
            if take_now or i == len(steps) - 1:
                t = deltas.take(s, since, tmp / f"d{i}.db", tmp / f"whole{i}.db")
                assert t.delta_rows >= 0
                assert apply(tmp / "held.db", tmp / f"d{i}.db", since[0]) == t.generation == s.generation
                assert tables(tmp / "held.db") == tables(tmp / f"whole{i}.db")
                assert t.mark is not None
                since = (t.generation, t.mark)
    assert_clean(path)


def test_the_change_log_covers_every_table_and_unset_removes_it(store):
    conn = sqlite3.connect(store.root / CATALOG_FILE)
    assert not deltas.installed(conn)
    assert deltas.install(store) and not deltas.install(store)
    assert deltas.installed(conn)
    triggers = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='trigger'")}
    for table, _ in deltas.catalog_tables(conn):
        assert {f"remote_changes_{table}_{k}" for k in "iukd"} <= triggers
    store.mkdir(ROOT_INO, b"run")
    store.write_file("/run/a", b"a" * 100)
    logged = {r[0] for r in conn.execute("SELECT DISTINCT tbl FROM remote_changes")}
    assert {"chunks", "extents", "versions", "dentries", "meta", "generations"} <= logged
    deltas.uninstall(store)
    assert not conn.execute("SELECT 1 FROM sqlite_master WHERE name LIKE 'remote_changes%'").fetchall()
    conn.close()
    store.write_file("/run/b", b"b" * 100)  # no log, no error


def test_no_delta_across_a_new_change_log_and_trim_keeps_what_is_newer(store, tmp_path):
    store.mkdir(ROOT_INO, b"run")
    deltas.install(store)
    t0 = deltas.take(store, None, None, None)
    store.write_file("/run/a", data(50_000, 1))
    t1 = deltas.take(store, (t0.generation, t0.mark), tmp_path / "d1.db", None)
    assert t1.delta_rows > 0 and t1.needs and t1.mark.seq > t0.mark.seq
    store.write_file("/run/b", data(50_000, 2))
    deltas.trim(store, t1.mark)
    conn = sqlite3.connect(store.root / CATALOG_FILE)
    assert conn.execute("SELECT min(seq) FROM remote_changes").fetchone()[0] > t1.mark.seq
    conn.close()
    deltas.uninstall(store)
    deltas.install(store)  # changes between were not logged: a new epoch, no delta from t1
    t2 = deltas.take(store, (t1.generation, t1.mark), tmp_path / "d2.db", None)
    assert t2.delta_rows == -1 and t2.mark.epoch != t1.mark.epoch


def test_a_delta_names_the_chunks_its_extents_use_even_unchanged_ones(store, tmp_path):
    """A body written again with bytes whose chunk rows exist (garbage not collected yet, or
    another file's): the delta carries those rows, so a receiver points them at packs, and
    the pass's needs include them."""
    store.mkdir(ROOT_INO, b"run")
    blob = data(200_000, 5)
    store.write_file("/run/a", blob)
    deltas.install(store)
    t0 = deltas.take(store, None, None, None)
    store.write_file("/run/b", blob)  # dedup: no new chunk row
    t1 = deltas.take(store, (t0.generation, t0.mark), tmp_path / "d.db", None)
    conn = sqlite3.connect(tmp_path / "d.db")
    rows = {bytes(r[0]) for r in conn.execute("SELECT hash FROM chunks")}
    logged = conn.execute("SELECT count(*) FROM delta_keys WHERE tbl='chunks'").fetchone()[0]
    conn.close()
    assert logged == 0 and rows and rows == {h for h, _ in t1.needs}


def test_a_delta_applies_only_to_its_start(store, tmp_path):
    store.mkdir(ROOT_INO, b"run")
    deltas.install(store)
    t0 = deltas.take(store, None, None, tmp_path / "w0.db")
    store.write_file("/run/a", data(10_000, 1))
    deltas.take(store, (t0.generation, t0.mark), tmp_path / "d.db", None)
    with pytest.raises(RemoteError, match="starts from generation"):
        apply(tmp_path / "w0.db", tmp_path / "d.db", t0.generation - 1)
    conn = sqlite3.connect(tmp_path / "w0.db")
    conn.execute("UPDATE meta SET value='other' WHERE key='store_uuid'")
    conn.commit()
    conn.close()
    with pytest.raises(RemoteError, match="another store"):
        apply(tmp_path / "w0.db", tmp_path / "d.db", t0.generation)
