"""Checkpoint detection rules and snapshot names, as pure functions (no store)."""
from __future__ import annotations

import pytest

from cowfs.store.catalog.events import Event
from cowfs.store.catalog.snapshots import validate_snapshot_name
from cowfs.store.checkpoints.rules import (
    DCP,
    DEEPSPEED,
    LIGHTNING,
    TRAINER,
    LightningLast,
    Trigger,
    detect,
    lightning_label,
    name_with_suffix,
    run_of,
    snapshot_name,
    step_label,
)


def ev(kind: str, path: str | None, old: str | None = None, size: int | None = 10) -> Event:
    return Event(kind, 7, 0, path, old, size)


DETECT = [
    # (event, expected (kind, path) or None)
    (ev("version", "/run1/checkpoint-500/trainer_state.json"), (TRAINER, "/run1/checkpoint-500/trainer_state.json")),
    (ev("rename", "/run1/checkpoint-500/trainer_state.json", "/run1/checkpoint-500/.tmp"),
     (TRAINER, "/run1/checkpoint-500/trainer_state.json")),
    (ev("link", "/checkpoint-5/trainer_state.json"), (TRAINER, "/checkpoint-5/trainer_state.json")),
    # transformers 4.36-4.37: the whole directory renamed into place
    (ev("rename", "/run1/checkpoint-500", "/run1/tmp-checkpoint-500", size=None),
     (TRAINER, "/run1/checkpoint-500/trainer_state.json")),
    (ev("version", "/run1/checkpoint-500/model.safetensors"), None),
    (ev("version", "/run1/checkpoint-500/optimizer.pt"), None),
    (ev("version", "/run1/trainer_state.json"), None),  # Trainer.save_state() at the end: not a checkpoint
    (ev("version", "/run1/checkpoint-x/trainer_state.json"), None),
    (ev("version", "/run1/checkpoint-5/checkpoint-6/trainer_state.json"), None),  # nested: not Trainer's layout
    (ev("version", "/run1/checkpoint-500/latest"), None),  # the Trainer's DeepSpeed tag: the Trainer rule covers it
    (ev("version", "/run1/checkpoint-500/pytorch_model_fsdp_0/.metadata"), None),  # FSDP's DCP inside a Trainer checkpoint
    (ev("version", "/lightning_logs/version_0/checkpoints/epoch=0-step=100.ckpt"),
     (LIGHTNING, "/lightning_logs/version_0/checkpoints/epoch=0-step=100.ckpt")),
    (ev("rename", "/ck/last.ckpt", "/ck/.tmp"), (LIGHTNING, "/ck/last.ckpt")),
    (ev("rename", "/ck/last.ckpt", "/ck/x", size=None), None),  # a symlink moved: no file completed
    (ev("version", "/ck/.ckpt"), None),
    (ev("rename", "/dcp/step-7/.metadata", "/dcp/step-7/.metadata.tmp"), (DCP, "/dcp/step-7/.metadata")),
    (ev("version", "/dcp/step-7/.metadata"), (DCP, "/dcp/step-7/.metadata")),
    (ev("version", "/dcp/step-7/__0_0.distcp"), None),
    (ev("version", "/dcp/step-7/.metadata.tmp"), None),
    (ev("version", "/ds/latest"), (DEEPSPEED, "/ds/latest")),
    (ev("version", "/ds/global_step5/mp_rank_00_model_states.pt"), None),
    (ev("remove", "/run1/checkpoint-500/trainer_state.json"), None),
    (ev("remove", "/run1/checkpoint-500", size=None), None),
    (Event("snapshot", 7, 0, snapshot="run1@step-500"), None),
]


@pytest.mark.parametrize("event, want", DETECT)
def test_detect(event, want):
    t = detect(event)
    assert (None if t is None else (t.kind, t.path)) == want
    if t is not None:
        assert t.generation == event.generation


@pytest.mark.parametrize("run, label, want", [
    ("/run1", "step-500", "run1@step-500"),
    ("/exp/a/run1", "step-500", "exp:a:run1@step-500"),
    ("/", "step-5", "step-5"),
    ("", "step-5", "step-5"),
    ("/.hidden/run", "step-5", "_.hidden:run@step-5"),
    ("/@odd", "x", "_@odd@x"),
])
def test_snapshot_names_are_legal_and_readable(run, label, want):
    assert snapshot_name(run, label) == want
    validate_snapshot_name(want)


def test_long_names_are_cut_from_the_run_side():
    name = snapshot_name("/" + "/".join(["d" * 50] * 10), "step-123")
    validate_snapshot_name(name)
    assert len(name.encode()) <= 255 and name.endswith("d@step-123")


def test_labels_runs_and_suffixes():
    assert step_label("global_step500") == "step-500" and step_label("step_7") == "step-7"
    assert step_label("final") == "final"
    assert lightning_label("epoch=2-step=300-val_loss=0.12.ckpt") == "step-300"
    assert lightning_label("last.ckpt") == "last"
    t = Trigger(LIGHTNING, "/lightning_logs/version_0/checkpoints/epoch=0-step=100.ckpt", 1)
    assert run_of(t, t.path) == "/lightning_logs/version_0"
    assert run_of(Trigger(DEEPSPEED, "/ds/latest", 1), "/ds/global_step5") == "/ds"
    assert run_of(Trigger(TRAINER, "/r/checkpoint-5/trainer_state.json", 1), "/r/checkpoint-5") == "/r"
    assert name_with_suffix("r@step-5", set()) == "r@step-5"
    assert name_with_suffix("r@step-5", {"r@step-5", "r@step-5.2"}) == "r@step-5.3"


def test_lightning_last_is_a_copy_where_step_named_checkpoints_are_saved():
    rule = LightningLast()
    step = Trigger(LIGHTNING, "/a/checkpoints/epoch=0-step=100.ckpt", 1)
    last_a = Trigger(LIGHTNING, "/a/checkpoints/last.ckpt", 2)
    last_b = Trigger(LIGHTNING, "/b/checkpoints/last-v1.ckpt", 3)  # save_top_k=0: only last is saved
    assert rule.wanted(last_a)  # nothing seen in /a yet
    assert rule.wanted(step) and not rule.wanted(last_a)
    assert rule.wanted(last_b) and rule.wanted(Trigger(TRAINER, "/r/checkpoint-1/trainer_state.json", 4))
