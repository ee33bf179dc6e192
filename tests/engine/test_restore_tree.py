"""Snapshots pinned at an earlier generation, and restoring a whole directory in one
transaction, on a real store (no mount). Every store is fsck'ed clean at teardown."""
from __future__ import annotations

import pytest

from cowfs.errors import Exists, HistoryDropped, InvalidArgument

from tests.support.checkpointutil import mkdirs, rmtree, save
from tests.support.storeutil import data


def test_snapshot_pinned_at_an_earlier_generation(store):
    g = save(store, "/run1", 100, 0.5)
    store.write_file("/run1/checkpoint-100/model.safetensors", b"changed after")
    mkdirs(store, "/run1/checkpoint-200")
    snap = store.snapshot_create("at-commit", g)
    assert snap.gen == g and store.snapshot("at-commit").gen == g
    assert store.read_file("/run1/checkpoint-100/model.safetensors", g) == data(50_000, 100)
    assert [n for n, _ in store.readdir(store.resolve("/run1").ino, g)] == [b"checkpoint-100"]
    with pytest.raises(InvalidArgument, match="not an earlier generation"):
        store.snapshot_create("future", store.generation + 1)
    with pytest.raises(Exists):
        store.snapshot_create("at-commit", g)
    g2 = store.generation
    store.expire_history()  # drops the replaced model version: G2 can no longer be shown whole
    with pytest.raises(HistoryDropped, match="expire at generation"):
        store.snapshot_create("too-late", g2)
    assert store.read_file("/run1/checkpoint-100/model.safetensors", g) == data(50_000, 100)  # pinned: kept


def test_restore_tree_is_one_transaction_with_bytes_modes_mtimes_and_links(store):
    save(store, "/run1", 100, 0.5)
    d = store.resolve("/run1/checkpoint-100").ino
    store.symlink(d, b"latest-model", b"model.safetensors")
    store.link(store.resolve("/run1/checkpoint-100/optimizer.pt").ino, d, b"optimizer-link.pt")
    mkdirs(store, "/run1/checkpoint-100/global_step100")
    store.write_file("/run1/checkpoint-100/global_step100/zero_rank0.pt", data(3000, 5), mode=0o600)
    gen = store.generation
    before = {p: store.resolve(f"/run1/checkpoint-100/{p}", gen) for p in
              ("model.safetensors", "optimizer.pt", "trainer_state.json", "global_step100/zero_rank0.pt")}
    snap = store.snapshot_create("s")
    rmtree(store, "/run1/checkpoint-100")
    events = []
    unsubscribe = store.events.subscribe(events.append)
    g0 = store.generation
    tree = store.restore_tree("/run1/checkpoint-100", snap.gen)
    unsubscribe()
    assert store.generation == g0 + 1 and tree.root.birth_gen == g0 + 1  # one transaction
    assert len(tree.files) == 4 and tree.bytes == sum(a.size for a in before.values())
    for p, old in before.items():
        now = store.resolve(f"/run1/checkpoint-100/{p}")
        assert store.read_file(f"/run1/checkpoint-100/{p}") == store.read_file(f"/run1/checkpoint-100/{p}", snap.gen)
        assert (now.mode, now.mtime_ns, now.content_id) == (old.mode, old.mtime_ns, old.content_id), p
    assert store.readlink(store.resolve("/run1/checkpoint-100/latest-model").ino) == b"model.safetensors"
    link = store.resolve("/run1/checkpoint-100/optimizer-link.pt")
    assert link.ino == store.resolve("/run1/checkpoint-100/optimizer.pt").ino and link.nlink == 2
    assert sorted(e.path for e in events) == sorted(
        f"/run1/checkpoint-100/{p}" for p in (*before, "optimizer-link.pt"))
    assert {e.kind for e in events} == {"version"}
    with pytest.raises(Exists, match="already exists"):
        store.restore_tree("/run1/checkpoint-100", snap.gen)
    tree2 = store.restore_tree("/run1/checkpoint-100", snap.gen, to="/run1/copy")
    assert store.read_file("/run1/copy/trainer_state.json") == store.read_file("/run1/checkpoint-100/trainer_state.json")
    assert tree2.parent == store.resolve("/run1").ino


def test_restore_tree_keeps_special_files_xattrs_times_and_groups(store):
    import stat

    from cowfs.store import ROOT_INO

    d = store.mkdir(ROOT_INO, b"ck", 0o2775, uid=0, gid=777)  # a set-group-ID directory
    f = store.write_file("/ck/model.pt", data(5000, 1))
    store.setattr(f.ino, gid=1000, atime_ns=123_456)  # a group other than the directory's
    store.setxattr(f.ino, b"user.step", b"500")
    store.mknod(d.ino, b"pipe", stat.S_IFIFO | 0o640)
    store.mknod(d.ino, b"null", stat.S_IFCHR | 0o666, rdev=(1 << 8) | 3)
    before = {n: a for n, a in store.readdir(d.ino)}
    snap = store.snapshot_create("s")
    rmtree(store, "/ck")
    store.restore_tree("/ck", snap.gen, to="/back")
    after = {n: a for n, a in store.readdir(store.resolve("/back").ino)}
    assert set(after) == set(before)
    for name, old in before.items():
        new = after[name]
        assert (new.mode, new.uid, new.gid, new.rdev, new.atime_ns, new.mtime_ns) == \
               (old.mode, old.uid, old.gid, old.rdev, old.atime_ns, old.mtime_ns), name
    assert store.getxattr(after[b"model.pt"].ino, b"user.step") == b"500"
    assert stat.S_ISFIFO(after[b"pipe"].mode) and after[b"null"].rdev == (1 << 8) | 3
