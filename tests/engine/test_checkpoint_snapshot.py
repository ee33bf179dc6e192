"""Planning a completed checkpoint's snapshot on a real store (no mount): the checks as of
the completing commit's generation, late writers, names, and checkpoints no snapshot holds.
Every store is fsck'ed clean at teardown."""
from __future__ import annotations

import pytest

from cowfs.store.checkpoints import snapshot as ckpt
from cowfs.store.checkpoints.rules import DCP, DEEPSPEED, LIGHTNING, TRAINER, Trigger
from tests.support.checkpointutil import mkdirs, rmtree, save


def test_plan_checks_each_kind_as_of_the_trigger_generation(store):
    g = save(store, "/exp/run1", 500, 0.5)
    p = ckpt.plan(store, Trigger(TRAINER, "/exp/run1/checkpoint-500/trainer_state.json", g))
    assert (p.name, p.checkpoint, p.directory) == ("exp:run1@step-500", "/exp/run1/checkpoint-500", "/exp/run1/checkpoint-500")
    with pytest.raises(ckpt.NotComplete, match="not there"):  # before the commit
        ckpt.plan(store, Trigger(TRAINER, "/exp/run1/checkpoint-500/trainer_state.json", g - 2))
    mkdirs(store, "/r/checkpoint-1")
    gb = store.write_file("/r/checkpoint-1/trainer_state.json", b"not json").birth_gen
    with pytest.raises(ckpt.NotComplete, match="not a trainer state"):
        ckpt.plan(store, Trigger(TRAINER, "/r/checkpoint-1/trainer_state.json", gb))
    mkdirs(store, "/lightning_logs/version_0/checkpoints")
    gl = store.write_file("/lightning_logs/version_0/checkpoints/epoch=0-step=100.ckpt", b"zip").birth_gen
    p = ckpt.plan(store, Trigger(LIGHTNING, "/lightning_logs/version_0/checkpoints/epoch=0-step=100.ckpt", gl))
    assert (p.name, p.directory) == ("lightning_logs:version_0@step-100", None)
    mkdirs(store, "/dcp/step-7")
    store.write_file("/dcp/step-7/__0_0.distcp", b"t")
    gd = store.write_file("/dcp/step-7/.metadata", b"m").birth_gen
    assert ckpt.plan(store, Trigger(DCP, "/dcp/step-7/.metadata", gd)).name == "dcp@step-7"
    mkdirs(store, "/ds/global_step5")
    gs = store.write_file("/ds/latest", b"global_step5\n").birth_gen
    p = ckpt.plan(store, Trigger(DEEPSPEED, "/ds/latest", gs))
    assert (p.name, p.directory) == ("ds@step-5", "/ds/global_step5")
    gs = store.write_file("/ds/latest", b"global_step6").birth_gen
    with pytest.raises(ckpt.NotComplete, match="does not exist"):
        ckpt.plan(store, Trigger(DEEPSPEED, "/ds/latest", gs))
    gs = store.write_file("/ds/latest", b"").birth_gen
    with pytest.raises(ckpt.NotComplete, match="non-empty"):
        ckpt.plan(store, Trigger(DEEPSPEED, "/ds/latest", gs))


def test_still_written_sees_late_files_and_open_writers(store):
    g = save(store, "/run1", 100, 0.5)
    p = ckpt.plan(store, Trigger(TRAINER, "/run1/checkpoint-100/trainer_state.json", g))
    assert not ckpt.still_written(store, p, [])
    other = store.write_file("/run1/elsewhere.bin", b"x")
    assert not ckpt.still_written(store, p, [other.ino])  # an open writer outside the checkpoint
    rank1 = store.create(store.resolve("/run1/checkpoint-100").ino, b"rank1.pt")
    assert ckpt.still_written(store, p, [rank1.ino])  # created after the trigger, still open
    assert ckpt.still_written(store, p, [])           # created after the trigger (data_gen > G)


def test_take_adds_a_suffix_and_already_snapshotted_spots_a_restore(store):
    g = save(store, "/run1", 100, 0.5)
    p = ckpt.plan(store, Trigger(TRAINER, "/run1/checkpoint-100/trainer_state.json", g))
    assert ckpt.already_snapshotted(store, p) is None
    assert ckpt.take(store, p.name, g).name == "run1@step-100"
    assert ckpt.already_snapshotted(store, p) is None  # a new save always gets its own snapshot
    g2 = save(store, "/run1", 100, 0.4, seed=9)  # the same step saved again
    assert ckpt.take(store, "run1@step-100", g2).name == "run1@step-100.2"
    assert ckpt.take(store, "run1@step-100", None).name == "run1@step-100.3"
    rmtree(store, "/run1/checkpoint-100")
    tree = store.restore_tree("/run1/checkpoint-100", g)  # puts the first save back
    restored = ckpt.plan(store, Trigger(TRAINER, "/run1/checkpoint-100/trainer_state.json", tree.root.birth_gen))
    assert ckpt.already_snapshotted(store, restored) == "run1@step-100"
    assert ckpt.missed(store) == []


def test_missed_finds_live_checkpoints_no_snapshot_holds(store):
    g1 = save(store, "/run1", 100, 0.5)
    save(store, "/run1", 200, 0.4)
    store.snapshot_create("holds-both")  # nothing missed
    assert ckpt.missed(store) == []
    g3 = save(store, "/run1", 300, 0.3)
    assert ckpt.missed(store) == [Trigger(TRAINER, "/run1/checkpoint-300/trainer_state.json", g3)]
    assert g1 < g3


def test_missed_gives_the_generation_a_renamed_checkpoint_arrived_at(store):
    save(store, "/run1", 100, 0.5)  # old transformers: saved as tmp-checkpoint-N, then renamed
    run1 = store.resolve("/run1").ino
    store.rename(run1, b"checkpoint-100", run1, b"tmp-checkpoint-100")
    save(store, "/run1", 50, 0.9)
    store.rename(run1, b"tmp-checkpoint-100", run1, b"checkpoint-100")
    renamed = store.generation
    triggers = {t.path: t for t in ckpt.missed(store)}
    t = triggers["/run1/checkpoint-100/trainer_state.json"]
    assert t.generation == renamed  # not the earlier commit of its trainer_state.json, under the other name
    assert ckpt.plan(store, t).name == "run1@step-100"
    assert triggers["/run1/checkpoint-50/trainer_state.json"].generation < renamed
