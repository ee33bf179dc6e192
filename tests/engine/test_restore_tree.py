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
