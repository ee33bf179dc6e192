"""The checkpoint index on a real store (no mount): HF Trainer checkpoints across snapshots
and the live tree, each save once. Every store is fsck'ed clean at teardown."""
from __future__ import annotations

import pytest

from cowfs.store.checkpoints import index as checkpoint_index
from cowfs.store.checkpoints import walk as checkpoint_walk
from tests.support.checkpointutil import dcp_save, deepspeed_save, lightning_save, mkdirs, rmtree, save


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
    monkeypatch.setattr(checkpoint_walk, "MAX_DIRS", 3)
    idx = checkpoint_index.build(store, under="/wide")
    assert idx.truncated


def test_index_finds_lightning_dcp_and_deepspeed_checkpoints(store):
    ck = "/lt/version_0/checkpoints"
    store.snapshot_create("lt:version_0@step-100", lightning_save(store, ck, "epoch=0-step=100.ckpt", 1))
    store.snapshot_create("lt:version_0@step-200", lightning_save(store, ck, "epoch=1-step=200.ckpt", 2))
    store.unlink(store.resolve(ck).ino, b"epoch=0-step=100.ckpt")  # save_top_k=1
    lightning_save(store, ck, "last.ckpt", 3)  # live only, no step in the name
    store.write_file(f"{ck}/empty.ckpt", b"")  # not a checkpoint
    store.snapshot_create("dcp@step-7", dcp_save(store, "/dcp/step-7", 10))
    mkdirs(store, "/dcp/step-8")  # crashed before .metadata
    store.write_file("/dcp/step-8/__0_0.distcp", b"partial")
    dcp_save(store, "/dcp/final", 20)
    store.snapshot_create("ds@step-10", deepspeed_save(store, "/ds", "global_step10", 30))
    mkdirs(store, "/ds/logs")  # beside the tags, never named by latest
    store.write_file("/ds/logs/events", b"x")
    store.snapshot_create("ds@step-20", deepspeed_save(store, "/ds", "global_step20", 40))
    rmtree(store, "/ds/global_step10")
    save(store, "/hf", 5, 0.5)  # a Trainer checkpoint holding a DeepSpeed latest and a DCP .metadata: one Trainer one
    deepspeed_save(store, "/hf/checkpoint-5", "global_step5", 50)
    dcp_save(store, "/hf/checkpoint-5/pytorch_model_fsdp_0", 60)
    idx = checkpoint_index.build(store)
    got = [(c.kind, c.path, c.step, c.live is not None) for c in idx.checkpoints]
    assert got == [  # newest save first
        ("trainer", "/hf/checkpoint-5", 5, True),
        ("deepspeed", "/ds/global_step20", 20, True),
        ("deepspeed", "/ds/global_step10", 10, False),
        ("dcp", "/dcp/final", None, True),
        ("dcp", "/dcp/step-7", 7, True),
        ("lightning", f"{ck}/last.ckpt", None, True),
        ("lightning", f"{ck}/epoch=1-step=200.ckpt", 200, True),
        ("lightning", f"{ck}/epoch=0-step=100.ckpt", 100, False),
    ]
    by_path = {c.path: c for c in idx.checkpoints}
    old_ds = by_path["/ds/global_step10"]
    assert old_ds.snapshots == ["ds@step-10", "ds@step-20"] and old_ds.restore_from.snapshot == "ds@step-10"
    assert old_ds.is_dir and old_ds.state is None
    old_lt = by_path[f"{ck}/epoch=0-step=100.ckpt"]
    assert old_lt.restore_from.snapshot == "lt:version_0@step-100" and not old_lt.is_dir
    assert old_lt.snapshots == ["lt:version_0@step-100", "lt:version_0@step-200"]
    assert by_path["/dcp/step-7"].own_snapshot == "dcp@step-7"
    assert [c.kind for c in checkpoint_index.build(store, kinds=checkpoint_walk.TRAINER_ONLY).checkpoints] == ["trainer"]
    # asking about one: a Lightning file, a DCP directory
    assert [c.path for c in checkpoint_index.build(store, under=f"{ck}/epoch=0-step=100.ckpt").checkpoints] == [
        f"{ck}/epoch=0-step=100.ckpt"]
    assert [c.path for c in checkpoint_index.build(store, under="/dcp/step-7").checkpoints] == ["/dcp/step-7"]
    # a restored DeepSpeed tag directory shares the bodies: the same save, live again
    store.restore_tree("/ds/global_step10", store.snapshot("ds@step-10").gen)
    again = {c.path: c for c in checkpoint_index.build(store, under="/ds").checkpoints}
    assert len(again) == 2 and again["/ds/global_step10"].live is not None
