"""What a consumer finds changed when it applies a delta (cowfs/remote/changes.py): the
inodes and entries from the delta's rows are those a scan of the catalog finds, and the
watch events computed from them are those a comparison of the two trees gives
(`Store.diff`, as the consumer computed them before), over random sequences of changes
with directories, renames, links and snapshots (hypothesis)."""
from __future__ import annotations

import sqlite3

import hypothesis.strategies as st
from hypothesis import HealthCheck, given, settings

from cowfs.remote import changes, deltas
from cowfs.store import ROOT_INO, Store
from cowfs.store.upkeep.diff import REMOVED, compare
from tests.support.storeutil import assert_clean, data, new_store


def change(s: Store, step: int, kind: int) -> None:
    run = s.resolve("/run").ino
    names = sorted(n for n, _ in s.readdir(run))
    files = [n for n, a in s.readdir(run) if a.is_file]
    dirs = [n for n, a in s.readdir(run) if a.is_dir]
    if kind == 0 or not names:
        s.write_file(f"/run/f{step % 3}.bin", data(20_000 + 100 * step, step))
    elif kind == 1:
        s.rename(run, names[0], run, f"r{step}".encode())
    elif kind == 2 and files:
        s.unlink(run, files[-1])
    elif kind == 3:
        d = s.mkdir(run, f"d{step}".encode())
        s.write_file(f"/run/d{step}/in.bin", data(5_000, step))
        s.mkdir(d.ino, b"sub")
        s.write_file(f"/run/d{step}/sub/deep.bin", data(6_000, step + 1))
    elif kind == 4 and dirs:  # a directory moved under another name, or over an empty one
        s.rename(run, dirs[0], ROOT_INO, f"moved{step}".encode())
    elif kind == 5 and files:
        ino = s.resolve(b"/run/" + files[0]).ino
        s.setattr(ino, mode=0o600 + step % 8)
    elif kind == 6 and files:
        s.link(s.resolve(b"/run/" + files[0]).ino, run, f"l{step}.bin".encode())
    elif kind == 7 and files:  # the same bytes written again: a new version, no event
        blob = s.read_file(b"/run/" + files[0])
        s.write_file(b"/run/" + files[0], blob)
    elif kind == 8:
        s.snapshot_create(f"snap{step}")
        s.write_file(f"/run/f{step % 3}.bin", data(20_000, step))
    elif kind == 9 and files:  # history dropped: rows deleted, not updated
        s.unlink(run, files[0])
        for snap in s.snapshot_list():
            s.snapshot_delete(snap.name)
        s.expire_history()
        s.gc()
    else:
        s.write_file(f"/run/f{step % 3}.bin", data(20_000, step))


def reference(conn: sqlite3.Connection, old: int, new: int) -> list[tuple[str, str, int | None]]:
    """The events the consumer gave before: from a comparison of the two trees."""
    out = []
    for e in compare(conn, old, new).entries:
        if e.change == REMOVED:
            out.append(("remove", e.path, None))
        elif e.kind == "file":
            out.append(("version", e.path, e.size_b))
    return sorted(out)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.tuples(st.integers(0, 10), st.booleans()), min_size=1, max_size=12))
def test_changes_from_a_delta_give_the_events_of_a_tree_comparison(tmp_path_factory, steps):
    tmp = tmp_path_factory.mktemp("changes")
    path = new_store(tmp / "s")
    held = tmp / "held.db"
    with Store.open(path) as s:
        s.mkdir(ROOT_INO, b"run")
        s.write_file("/run/f0.bin", data(30_000, 99))
        deltas.install(s)
        first = deltas.take(s, None, None, held)
        since = (first.generation, first.mark)
        expired = False  # history dropped since the last delta: the old generation's tree is partly gone
        for i, (kind, take_now) in enumerate(steps):
            change(s, i + 1, kind)
            expired = expired or kind == 9
            if not (take_now or i == len(steps) - 1):
                continue
            t = deltas.take(s, since, tmp / f"d{i}.db", None)
            old, new = since[0], t.generation
            conn = sqlite3.connect(held, isolation_level=None)
            try:
                conn.execute("ATTACH DATABASE ? AS d", (str(tmp / f"d{i}.db"),))
                conn.execute("BEGIN")
                assert deltas.apply_delta(conn, old) == new
                got = changes.Changes(old, new)
                got.add_rows(conn, "d", old, new)
                conn.execute("COMMIT")
                scanned = changes.scan(conn, old, new)
                assert scanned.inos <= got.inos and scanned.entries <= got.entries  # and the rows deleted
                events = sorted((e.kind, e.path, e.size) for e in changes.events(conn, got))
                if not expired:  # else the comparison sees the expired tree's files as added
                    assert events == reference(conn, old, new)
            finally:
                conn.close()
            assert t.mark is not None
            since, expired = (new, t.mark), False
    assert_clean(path)


def test_events_of_a_moved_directory_name_every_path_under_it(tmp_path):
    s = Store.open(new_store(tmp_path / "s"))
    with s:
        run = s.mkdir(ROOT_INO, b"run")
        s.mkdir(run.ino, b"ckpt")
        s.write_file("/run/ckpt/model.safetensors", data(10_000, 1))
        s.write_file("/run/ckpt/optimizer.pt", data(12_000, 2))
        old = s.generation
        s.rename(run.ino, b"ckpt", ROOT_INO, b"best")
        new = s.generation
        conn = sqlite3.connect(s.root / "catalog.db")
        try:
            got = [(e.kind, e.path, e.size) for e in changes.events(conn, changes.scan(conn, old, new))]
        finally:
            conn.close()
    assert got == [("version", "/best/model.safetensors", 10_000), ("version", "/best/optimizer.pt", 12_000),
                   ("remove", "/run/ckpt", None), ("remove", "/run/ckpt/model.safetensors", None),
                   ("remove", "/run/ckpt/optimizer.pt", None)]
    assert_clean(s.root)


def test_a_delta_names_the_entries_whose_rows_it_deletes(tmp_path):
    """A file unlinked and its history dropped between two uploads: its rows are gone from
    the catalog, so no scan finds the entry, but the delta's keys do (the kernel may cache it)."""
    path = new_store(tmp_path / "s")
    held = tmp_path / "held.db"
    with Store.open(path) as s:
        run = s.mkdir(ROOT_INO, b"run")
        s.write_file("/run/a.bin", data(30_000, 1))
        deltas.install(s)
        first = deltas.take(s, None, None, held)
        s.unlink(run.ino, b"a.bin")
        s.expire_history()
        s.gc()
        t = deltas.take(s, (first.generation, first.mark), tmp_path / "d.db", None)
        conn = sqlite3.connect(held, isolation_level=None)
        try:
            conn.execute("ATTACH DATABASE ? AS d", (str(tmp_path / "d.db"),))
            conn.execute("BEGIN")
            deltas.apply_delta(conn, first.generation)
            got = changes.Changes(first.generation, t.generation)
            got.add_rows(conn, "d", first.generation, t.generation)
            conn.execute("COMMIT")
            assert not conn.execute("SELECT 1 FROM dentries WHERE name = ?", (b"a.bin",)).fetchall()
            assert (run.ino, b"a.bin") not in changes.scan(conn, first.generation, t.generation).entries
        finally:
            conn.close()
        assert (run.ino, b"a.bin") in got.entries
    assert_clean(path)
