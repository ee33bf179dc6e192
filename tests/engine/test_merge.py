"""The merged catalog of several stores (cowfs/remote/merge.py): after every step of any
store, the merged tree is the union of the stores' trees by the clash rule, checked against
a model computed from each store's whole tree (hypothesis), and the rule itself on clashes
made by hand."""
from __future__ import annotations

import sqlite3
import stat
from pathlib import Path

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings

from cowfs.errors import CowfsError
from cowfs.remote.changes import scan
from cowfs.remote.merge import MergedCatalog, fresh
from cowfs.remote.state import RemoteState
from cowfs.store import ROOT_INO, Store
from cowfs.store.catalog.schema import LIVE
from cowfs.store.log.layout import CATALOG_FILE
from tests.support.storeutil import assert_clean, data, new_store

Tree = dict[bytes, tuple]  # path -> ("dir",) or ("file", mode, size, chunk hashes) or ("symlink", target)


def _node(conn: sqlite3.Connection, ino: int, gen: int) -> tuple:
    size, mode, content, target = conn.execute(
        "SELECT size, mode, content_id, target FROM versions WHERE ino=? AND birth_gen<=? AND death_gen>?",
        (ino, gen, gen)).fetchone()
    if stat.S_ISDIR(mode):
        return ("dir",)
    if stat.S_ISLNK(mode):
        return ("symlink", bytes(target))
    hashes = tuple(bytes(h) if h is not None else None for (h,) in conn.execute(
        "SELECT c.hash FROM extents e LEFT JOIN chunks c ON c.cid = e.cid WHERE e.content_id=? ORDER BY e.file_offset",
        (content,)))
    return ("file", mode, size, hashes)


def tree_of(path: Path) -> tuple[Tree, dict[bytes, int]]:
    """A catalog's live tree, and for each path the generation of its last change (the later
    of its entry's and its version's birth): what the clash rule compares."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        gen = LIVE - 1
        tree: Tree = {b"": ("dir",)}
        changed: dict[bytes, int] = {}
        stack = [(ROOT_INO, b"")]
        while stack:
            ino, head = stack.pop()
            for name, child, born in conn.execute(
                    "SELECT name, ino, birth_gen FROM dentries WHERE parent=? AND death_gen=?", (ino, LIVE)).fetchall():
                p = head + b"/" + bytes(name) if head else bytes(name)
                tree[p] = _node(conn, child, gen)
                (vborn,) = conn.execute("SELECT birth_gen FROM versions WHERE ino=? AND death_gen=?",
                                        (child, LIVE)).fetchone()
                changed[p] = max(born, vborn)
                if tree[p] == ("dir",):
                    stack.append((child, p))
        return tree, changed
    finally:
        conn.close()


def expected_union(stores: dict[str, Path]) -> Tree:
    """The union by the rule, computed from whole trees: a path shows the entry of the store
    whose last change there has the highest (generation, uuid); directories merge."""
    trees = {u: tree_of(p) for u, p in stores.items()}
    out: Tree = {b"": ("dir",)}

    def visit(path: bytes) -> None:
        cands = [(trees[u][1].get(path, 0), u) for u in sorted(trees) if path in trees[u][0]]
        if path and not cands:
            return
        if path:
            win = max(cands)[1]
            out[path] = trees[win][0][path]
            if out[path] != ("dir",):
                return
        names: set[bytes] = set()
        for _, u in cands or [(0, u) for u in trees]:
            if trees[u][0].get(path) == ("dir",):
                prefix = path + b"/" if path else b""
                names.update(p[len(prefix):] for p in trees[u][0]
                             if p.startswith(prefix) and p != path and b"/" not in p[len(prefix):])
        for name in sorted(names):
            visit(path + b"/" + name if path else name)

    visit(b"")
    return out


def merged_tree(m: MergedCatalog) -> Tree:
    return tree_of(m.path)[0]


PATHS = [b"a", b"b", b"a/x", b"a/y", b"a/d", b"a/d/z", b"b/x"]


def change(s: Store, step: int, op: int, path: bytes) -> None:
    """One change of store `s` at `path` (changes that do not apply there are skipped)."""
    head, _, name = path.rpartition(b"/")
    try:
        parent = s.resolve(b"/" + head).ino if head else ROOT_INO
        if op == 0:
            s.write_file(b"/" + path, data(3_000 + step, step))
        elif op == 1:
            s.mkdir(parent, name)
        elif op == 2:
            if s.lookup(parent, name).is_dir:
                s.rmdir(parent, name)
            else:
                s.unlink(parent, name)
        elif op == 3:
            to_head, _, to_name = PATHS[step % len(PATHS)].rpartition(b"/")
            to_parent = s.resolve(b"/" + to_head).ino if to_head else ROOT_INO
            s.rename(parent, name, to_parent, to_name)
        else:
            s.symlink(parent, name, b"target-%d" % step)
    except CowfsError:
        pass


def _remote_db(tmp: Path) -> Path:
    RemoteState(tmp / "remote.db", "s3://b/p").close()
    return tmp / "remote.db"


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 4), st.sampled_from(PATHS), st.booleans()),
                      min_size=1, max_size=25))
def test_each_step_leaves_the_union_by_the_rule(tmp_path_factory, steps):
    tmp = tmp_path_factory.mktemp("merge")
    paths = [new_store(tmp / f"s{i}") for i in range(3)]
    stores = [Store.open(p) for p in paths]
    try:
        uuids = [s.config.store_uuid for s in stores]
        files = {u: p / CATALOG_FILE for u, p in zip(uuids, paths)}
        m = fresh(tmp / "union.db", _remote_db(tmp))
        held = {u: 0 for u in uuids}
        pending: set[int] = set()
        for i, (which, op, path, merge_now) in enumerate(steps):
            change(stores[which], i, op, path)
            pending.add(which)
            if not merge_now and i < len(steps) - 1:
                continue
            for w in sorted(pending):  # several changes of a store in one step, as a delta brings them
                u = uuids[w]
                new = stores[w].generation
                conn = sqlite3.connect(f"file:{files[u]}?mode=ro", uri=True)
                changes = None if held[u] == 0 else scan(conn, held[u], new)
                conn.close()
                m.step(u, files[u], held[u], new, changes)
                held[u] = new
            pending.clear()
            assert merged_tree(m) == expected_union({u: files[u] for u in uuids if held[u]})
        full = fresh(tmp / "again.db", tmp / "remote.db")  # a merge from scratch gives the same tree
        for u in uuids:
            full.step(u, files[u], 0, held[u], None)
        assert merged_tree(full) == merged_tree(m)
        full.close()
        m.close()
    finally:
        for s in stores:
            s.close()
    for p in paths:
        assert_clean(p)


@pytest.fixture
def two(tmp_path):
    paths = [new_store(tmp_path / n) for n in ("s0", "s1")]
    stores = [Store.open(p) for p in paths]
    yield tmp_path, paths, stores
    for s in stores:
        s.close()
    for p in paths:
        assert_clean(p)


def _step(m: MergedCatalog, s: Store, path: Path, held: dict[str, int]) -> None:
    u = s.config.store_uuid
    conn = sqlite3.connect(f"file:{path / CATALOG_FILE}?mode=ro", uri=True)
    changes = None if u not in held else scan(conn, held[u], s.generation)
    conn.close()
    m.step(u, path / CATALOG_FILE, held.get(u, 0), s.generation, changes)
    held[u] = s.generation


def _read(m: MergedCatalog, path: bytes) -> tuple:
    return merged_tree(m)[path]


def test_the_later_generation_wins_a_clash_and_the_loser_shows_again_when_it_goes(two):
    tmp, paths, (a, b) = two
    m = fresh(tmp / "union.db", _remote_db(tmp))
    held: dict[str, int] = {}
    for s in (a, b):
        s.mkdir(ROOT_INO, b"run")
    a.write_file("/run/x", b"from a")
    b.observe_generation(a.generation + 5)  # b saw a's change: its next commit is later
    b.write_file("/run/x", b"from b")
    _step(m, a, paths[0], held)
    _step(m, b, paths[1], held)
    tree = merged_tree(m)
    assert tree[b"run/x"] == tree_of(paths[1] / CATALOG_FILE)[0][b"run/x"]  # b's is later
    a.observe_generation(b.generation)
    a.write_file("/run/x", b"a again")  # now a's generation is the higher one
    _step(m, a, paths[0], held)
    assert merged_tree(m)[b"run/x"] == tree_of(paths[0] / CATALOG_FILE)[0][b"run/x"]
    a.unlink(a.resolve("/run").ino, b"x")  # the winner goes: b's version shows again
    _step(m, a, paths[0], held)
    assert merged_tree(m)[b"run/x"] == tree_of(paths[1] / CATALOG_FILE)[0][b"run/x"]
    m.close()


def test_equal_generations_go_to_the_larger_uuid_and_a_file_can_hide_a_directory(two):
    tmp, paths, (a, b) = two
    m = fresh(tmp / "union.db", _remote_db(tmp))
    held: dict[str, int] = {}
    a.write_file("/p", b"file in a")
    b.write_file("/p", b"file in b")
    assert a.generation == b.generation  # the same generations: the larger uuid wins
    _step(m, a, paths[0], held)
    _step(m, b, paths[1], held)
    larger = max((a, b), key=lambda s: s.config.store_uuid)
    assert merged_tree(m)[b"p"] == tree_of(paths[(a, b).index(larger)] / CATALOG_FILE)[0][b"p"]
    b.unlink(ROOT_INO, b"p")
    b.mkdir(ROOT_INO, b"p")
    b.write_file("/p/inner", b"in b's directory")  # b's directory is now the later change
    _step(m, b, paths[1], held)
    assert merged_tree(m)[b"p"] == ("dir",) and b"p/inner" in merged_tree(m)
    a.observe_generation(b.generation)
    a.write_file("/p", b"file in a, later")  # a's file is later: the directory and what it holds are hidden
    _step(m, a, paths[0], held)
    assert merged_tree(m)[b"p"][0] == "file" and b"p/inner" not in merged_tree(m)
    b.mkdir(ROOT_INO, b"q")
    a.mkdir(ROOT_INO, b"q")  # equal or not, a directory in both is one directory holding both
    a.write_file("/q/1", b"1")
    b.write_file("/q/2", b"2")
    _step(m, a, paths[0], held)
    _step(m, b, paths[1], held)
    tree = merged_tree(m)
    assert {b"q/1", b"q/2"} <= set(tree)
    assert tree == expected_union({s.config.store_uuid: p / CATALOG_FILE for s, p in zip((a, b), paths)})
    m.close()


def test_a_store_that_leaves_takes_its_entries_with_it(two):
    tmp, paths, (a, b) = two
    m = fresh(tmp / "union.db", _remote_db(tmp))
    held: dict[str, int] = {}
    a.write_file("/only-a", b"a")
    b.write_file("/only-b", b"b")
    _step(m, a, paths[0], held)
    _step(m, b, paths[1], held)
    assert {b"only-a", b"only-b"} <= set(merged_tree(m))
    changes = m.forget(a.config.store_uuid)
    assert set(merged_tree(m)) == {b"", b"only-b"}
    assert changes.entries  # the kernel is told
    m.close()


def test_observed_generations_order_later_changes_after_them(tmp_path):
    path = new_store(tmp_path / "s")
    with Store.open(path) as s:
        rows = s.catalog.read(lambda c: c.execute("SELECT count(*) FROM generations").fetchone()[0])
        assert s.observe_generation(500) and s.generation == 500
        assert not s.observe_generation(20) and s.generation == 500  # only upwards
        assert s.catalog.read(lambda c: c.execute("SELECT count(*) FROM generations").fetchone()[0]) == rows
        attr = s.write_file("/after", b"seen 500 first")
        assert attr.birth_gen > 500
    with Store.open(path) as s:  # the durable commit after it carried it
        assert s.generation > 500 and s.read_file("/after") == b"seen 500 first"
    assert_clean(path)
