"""The checkpoint index on a real store (no mount): HF Trainer checkpoints across snapshots
and the live tree, each save once. Every store is fsck'ed clean at teardown."""
from __future__ import annotations

import pytest

from cowfs.store import checkpoint_index

from tests.support.checkpointutil import mkdirs, rmtree, save


def test_index_dedups_across_snapshots_and_names_each_snapshots_checkpoint(store):
    for step, loss in ((100, 0.9), (200, 0.4), (300, 0.6)):
        g = save(store, "/run1", step, loss)
        store.snapshot_create(f"run1@step-{step}", g)
        if step == 300:
            rmtree(store, "/run1/checkpoint-100")  # rotation
    store.snapshot_create("manual")
    save(store, "/run2/nested", 5, 1.0)  # live only
    idx = checkpoint_index.build(store)
    assert [c.state.global_step for c in idx.checkpoints] == [5, 300, 200, 100]  # newest save first
    by_step = {c.state.global_step: c for c in idx.checkpoints}
    assert by_step[100].snapshots == ["run1@step-100", "run1@step-200", "run1@step-300"] and by_step[100].live is None
    assert by_step[200].own_snapshot == "run1@step-200" and by_step[200].restore_from.snapshot == "run1@step-200"
    assert by_step[300].own_snapshot == "run1@step-300"
    assert by_step[5].snapshots == [] and by_step[5].live.path == "/run2/nested/checkpoint-5"
    assert by_step[200].state.metrics == {"loss": pytest.approx(0.5), "eval_loss": 0.4}
    assert idx.main("run1@step-200").state.global_step == 200 and idx.main("manual").state.global_step == 300
    assert idx.in_snapshot["manual"] == [by_step[300].key, by_step[200].key]
    # a restored copy shares the body: the same checkpoint, now live again
    store.restore_tree("/run1/checkpoint-100", store.snapshot("run1@step-100").gen)
    again = {c.state.global_step: c for c in checkpoint_index.build(store).checkpoints}
    assert len(again) == 4 and again[100].live is not None and again[100].saved_gen == by_step[100].saved_gen
    only = checkpoint_index.build(store, under="/run1/checkpoint-200")
    assert [c.state.global_step for c in only.checkpoints] == [200]


def test_index_skips_incomplete_and_bad_checkpoints_and_bounds_the_search(store, monkeypatch):
    save(store, "/run1", 100, 0.5)
    mkdirs(store, "/run1/checkpoint-200")  # crashed before trainer_state.json
    store.write_file("/run1/checkpoint-200/model.safetensors", b"partial")
    mkdirs(store, "/run1/checkpoint-300")
    store.write_file("/run1/checkpoint-300/trainer_state.json", b"{garbled")
    assert [c.state.global_step for c in checkpoint_index.build(store).checkpoints] == [100]
    for i in range(6):
        mkdirs(store, f"/wide/d{i}")
    save(store, "/wide/d5", 7, 0.1)
    monkeypatch.setattr(checkpoint_index, "MAX_DIRS", 3)
    idx = checkpoint_index.build(store, under="/wide")
    assert idx.truncated
