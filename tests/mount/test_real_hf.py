"""Hugging Face's real training libraries through a real mount, on the CPU, with tiny models
made here (no downloads, nothing reaches the network):

- transformers.Trainer: save_steps with save_total_limit rotation, a cowfs snapshot after each
  save (`cowfs snapshot create`), resume_from_checkpoint=True from the mount, the rotated-away
  checkpoint read byte-exact from its snapshot and resumed from there after a remount;
- accelerate: Accelerator.save_state with automatic naming and total_limit, load_state of the
  latest checkpoint and of a rotated-away one from a snapshot, and again after a remount.

Every loaded state is compared bitwise with the one that was saved; the store must fsck clean."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn as nn

from tests.support.frameworkutil import assert_same, by_number, digests, framework_env, frozen, quiet_loggers, snapshot  # noqa: F401
from tests.support.mountutil import mounted

pytestmark = pytest.mark.mount


# -- transformers.Trainer -----------------------------------------------------------------------

HF_MAX_STEPS = 10      # one epoch: 40 sequences in batches of 4
HF_STOP_AT = 6         # the first run stops here (after its save), as if the job had been preempted
HF_SAVE_STEPS = 2
HF_KEEP = 2            # save_total_limit


@pytest.mark.long
def test_transformers_trainer_rotation_resume_and_rotated_checkpoint_from_snapshot(store_path, tmp_path, framework_env):
    pytest.importorskip("transformers")
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
    from transformers.trainer_callback import PrinterCallback

    quiet_loggers()  # (no progress bars: framework_env sets HF_HUB_DISABLE_PROGRESS_BARS before the import)
    config = GPT2Config(vocab_size=256, n_positions=32, n_embd=64, n_layer=2, n_head=2,
                        bos_token_id=0, eos_token_id=0, tie_word_embeddings=False)  # ~0.5 MB of fp32 weights

    def new_model(seed: int) -> GPT2LMHeadModel:
        torch.manual_seed(seed)
        return GPT2LMHeadModel(config)

    class Tokens(torch.utils.data.Dataset):
        def __init__(self) -> None:
            self.ids = torch.randint(0, 256, (40, 32), generator=torch.Generator().manual_seed(1))

        def __len__(self) -> int:
            return len(self.ids)

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            return {"input_ids": self.ids[i], "labels": self.ids[i]}

    def training_args(out: Path, **overrides: Any) -> TrainingArguments:
        kwargs: dict[str, Any] = dict(
            output_dir=str(out), max_steps=HF_MAX_STEPS, save_steps=HF_SAVE_STEPS, save_total_limit=HF_KEEP,
            per_device_train_batch_size=4, learning_rate=1e-3, logging_steps=1, seed=0, use_cpu=True,
            report_to="none", dataloader_num_workers=0, disable_tqdm=True, log_level="error")
        kwargs.update(overrides)
        return TrainingArguments(**kwargs)

    def trainer(model: GPT2LMHeadModel, args: TrainingArguments, *callbacks: TrainerCallback) -> Trainer:
        t = Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=list(callbacks))
        t.remove_callback(PrinterCallback)  # the loss dicts on stdout
        return t

    class RecordSaves(TrainerCallback):
        """At each save: what was saved (model, optimizer, scheduler, the files' digests) and the
        checkpoints left after the rotation; then a cowfs snapshot; stops the run at `stop_at`."""

        def __init__(self, mnt: Path, out: Path, stop_at: int, snapshot_prefix: str | None) -> None:
            self.mnt, self.out, self.stop_at, self.snapshot_prefix = mnt, out, stop_at, snapshot_prefix
            self.saved: dict[int, dict[str, Any]] = {}

        def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
            if state.global_step == self.stop_at:
                control.should_training_stop = True  # the save of this step still happens

        def on_save(self, args, state, control, model=None, optimizer=None, lr_scheduler=None, **kwargs):  # type: ignore[no-untyped-def]
            step = state.global_step
            self.saved[step] = {"model": frozen(model.state_dict()), "optimizer": frozen(optimizer.state_dict()),
                                "scheduler": frozen(lr_scheduler.state_dict()),
                                "files": digests(self.out / f"checkpoint-{step}"),
                                "live": by_number(os.listdir(self.out))}
            if self.snapshot_prefix:
                snapshot(self.mnt, f"{self.snapshot_prefix}{step}")

    class RecordResume(TrainerCallback):
        """What the Trainer holds when training (re)starts, after it loaded the checkpoint."""

        def __init__(self) -> None:
            self.seen: dict[str, Any] = {}

        def on_train_begin(self, args, state, control, model=None, optimizer=None, lr_scheduler=None, **kwargs):  # type: ignore[no-untyped-def]
            self.seen = {"step": state.global_step, "model": frozen(model.state_dict()),
                         "optimizer": frozen(optimizer.state_dict()), "scheduler": frozen(lr_scheduler.state_dict())}

    def assert_resumed_from(seen: dict[str, Any], saved: dict[str, Any], step: int) -> None:
        assert seen["step"] == step
        for part in ("model", "optimizer", "scheduler"):
            assert_same(saved[part], seen[part], f"{part} resumed at step {step}")

    # the run as it would go uninterrupted, on the test's own disk, for the final weights
    reference = trainer(new_model(0), training_args(tmp_path / "reference", save_strategy="no"))
    reference.train()
    reference_weights = frozen(reference.model.state_dict())

    mnt = tmp_path / "mnt"
    with mounted(store_path, mnt) as m:
        out = m / "run"
        first = RecordSaves(m, out, HF_STOP_AT, snapshot_prefix="hf-step-")
        trainer(new_model(0), training_args(out), first).train()
        saves = list(range(HF_SAVE_STEPS, HF_STOP_AT + 1, HF_SAVE_STEPS))
        assert sorted(first.saved) == saves
        for step in saves:  # save_total_limit: the oldest beyond the limit went at each save
            assert first.saved[step]["live"] == [f"checkpoint-{s}" for s in saves if step - HF_KEEP * HF_SAVE_STEPS < s <= step]
        assert by_number(os.listdir(out)) == first.saved[HF_STOP_AT]["live"]
        rotated = f"checkpoint-{HF_SAVE_STEPS}"
        assert rotated not in os.listdir(out)

        # every snapshot holds the checkpoints live at its save, byte for byte
        for step in saves:
            snap_out = m / ".snapshots" / f"hf-step-{step}" / "run"
            assert by_number(os.listdir(snap_out)) == first.saved[step]["live"], step
            for name in first.saved[step]["live"]:
                assert digests(snap_out / name) == first.saved[int(name.split("-")[1])]["files"], (step, name)
        # the rotated-away checkpoint loads from its snapshot as it was saved
        old = m / ".snapshots" / f"hf-step-{HF_SAVE_STEPS}" / "run" / rotated
        assert_same(first.saved[HF_SAVE_STEPS]["model"], GPT2LMHeadModel.from_pretrained(old).state_dict(), "model from the snapshot")
        assert_same(first.saved[HF_SAVE_STEPS]["optimizer"], torch.load(old / "optimizer.pt", weights_only=True),
                    "optimizer.pt from the snapshot")

        # resume_from_checkpoint=True: the Trainer finds the newest checkpoint in the mount
        resume = RecordResume()
        second = RecordSaves(m, out, HF_MAX_STEPS, snapshot_prefix=None)
        resumed = trainer(new_model(1), training_args(out), resume, second)
        resumed.train(resume_from_checkpoint=True)
        assert_resumed_from(resume.seen, first.saved[HF_STOP_AT], HF_STOP_AT)
        assert resumed.state.global_step == HF_MAX_STEPS
        assert by_number(os.listdir(out)) == [f"checkpoint-{HF_MAX_STEPS - HF_SAVE_STEPS}", f"checkpoint-{HF_MAX_STEPS}"]
        final_weights = frozen(resumed.model.state_dict())
        assert_same(reference_weights, final_weights, "resumed run vs the uninterrupted one")

    with mounted(store_path, mnt) as m:
        last = m / "run" / f"checkpoint-{HF_MAX_STEPS}"
        assert digests(last) == second.saved[HF_MAX_STEPS]["files"]
        assert_same(final_weights, GPT2LMHeadModel.from_pretrained(last).state_dict(), "last checkpoint after remount")
        # roll back: resume from the rotated-away checkpoint in the (read-only) snapshot; the
        # run replays the original one bit for bit
        old = m / ".snapshots" / f"hf-step-{HF_SAVE_STEPS}" / "run" / rotated
        resume = RecordResume()
        replay = RecordSaves(m, m / "rollback", 2 * HF_SAVE_STEPS, snapshot_prefix=None)
        trainer(new_model(2), training_args(m / "rollback"), resume, replay).train(resume_from_checkpoint=str(old))
        assert_resumed_from(resume.seen, first.saved[HF_SAVE_STEPS], HF_SAVE_STEPS)
        assert sorted(replay.saved) == [2 * HF_SAVE_STEPS]
        for part in ("model", "optimizer", "scheduler"):
            assert_same(first.saved[2 * HF_SAVE_STEPS][part], replay.saved[2 * HF_SAVE_STEPS][part], f"replayed {part}")
        assert os.listdir(m / "rollback") == [f"checkpoint-{2 * HF_SAVE_STEPS}"]


# -- accelerate ---------------------------------------------------------------------------------

ACC_STEPS = 4  # 32 samples in batches of 8
ACC_KEEP = 2   # ProjectConfiguration.total_limit


class Progress:
    """A custom object registered for checkpointing (accelerate pickles its state_dict)."""

    def __init__(self) -> None:
        self.step = 0
        self.losses: list[float] = []

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "losses": list(self.losses)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step, self.losses = state["step"], list(state["losses"])


def test_accelerate_save_state_rotation_and_load_state(store_path, tmp_path, framework_env):
    pytest.importorskip("accelerate")
    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration, set_seed

    from tests.support.frameworkutil import reset_accelerate_state

    quiet_loggers()

    features = torch.randn(32, 16, generator=torch.Generator().manual_seed(0))
    targets = features @ torch.randn(16, 4, generator=torch.Generator().manual_seed(1))

    def accelerator(project_dir: Path) -> Accelerator:
        reset_accelerate_state()  # a new process, as far as accelerate can tell
        return Accelerator(cpu=True, project_config=ProjectConfiguration(
            project_dir=str(project_dir), automatic_checkpoint_naming=True, total_limit=ACC_KEEP))

    def prepared(acc: Accelerator, seed: int) -> tuple[nn.Module, Any, Any, Any, Progress]:
        torch.manual_seed(seed)
        model = nn.Sequential(nn.Linear(16, 256), nn.BatchNorm1d(256), nn.ReLU(), nn.Linear(256, 4))  # ~80 KB
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.8)
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(features, targets), batch_size=8,
                                             shuffle=True, num_workers=0)
        progress = Progress()
        acc.register_for_checkpointing(progress)
        return (*acc.prepare(model, opt, sched, loader), progress)

    def state_of(model: nn.Module, opt: Any, sched: Any, progress: Progress) -> dict[str, Any]:
        return frozen({"model": model.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                       "progress": progress.state_dict(), "torch_rng": torch.random.get_rng_state()})

    def train_step(acc: Accelerator, model: nn.Module, opt: Any, sched: Any, progress: Progress, x: torch.Tensor, y: torch.Tensor) -> None:
        loss = nn.functional.mse_loss(model(x), y)
        acc.backward(loss)
        opt.step()
        sched.step()
        opt.zero_grad()
        progress.step += 1
        progress.losses.append(loss.item())

    mnt = tmp_path / "mnt"
    with mounted(store_path, mnt) as m:
        project = m / "acc"
        checkpoints = project / "checkpoints"
        acc = accelerator(project)
        set_seed(0)
        model, opt, sched, loader, progress = prepared(acc, 0)
        saved: list[dict[str, Any]] = []
        for i, (x, y) in enumerate(loader):
            train_step(acc, model, opt, sched, progress, x, y)
            acc.save_state()
            saved.append(state_of(model, opt, sched, progress))
            assert by_number(os.listdir(checkpoints)) == [f"checkpoint_{j}" for j in range(max(0, i - ACC_KEEP + 1), i + 1)]
            if i == 0:
                snapshot(m, "acc-0")
        assert len(saved) == ACC_STEPS
        files = set(os.listdir(checkpoints / f"checkpoint_{ACC_STEPS - 1}"))
        assert {"model.safetensors", "optimizer.bin", "scheduler.bin", "random_states_0.pkl",
                "custom_checkpoint_0.pkl"} <= files, files

        # a fresh Accelerator (other initial weights, other RNG) loads the latest checkpoint
        acc = accelerator(project)
        model, opt, sched, loader, progress = prepared(acc, 1)
        torch.manual_seed(12345)
        acc.load_state()
        assert_same(saved[-1], state_of(model, opt, sched, progress), "latest checkpoint")
        # the rotated-away checkpoint_0 from the snapshot
        acc.load_state(str(m / ".snapshots" / "acc-0" / "acc" / "checkpoints" / "checkpoint_0"))
        assert_same(saved[0], state_of(model, opt, sched, progress), "checkpoint_0 from the snapshot")
        # back to the latest and on: the next save is checkpoint_4 and rotates checkpoint_2 away
        acc.load_state()
        acc.project_configuration.iteration = ACC_STEPS
        x, y = next(iter(loader))
        train_step(acc, model, opt, sched, progress, x, y)
        acc.save_state()
        after_resume = state_of(model, opt, sched, progress)
        assert by_number(os.listdir(checkpoints)) == [f"checkpoint_{ACC_STEPS - 1}", f"checkpoint_{ACC_STEPS}"]

    with mounted(store_path, mnt) as m:
        acc = accelerator(m / "acc")
        model, opt, sched, loader, progress = prepared(acc, 2)
        acc.load_state()
        assert_same(after_resume, state_of(model, opt, sched, progress), "latest checkpoint after remount")
        assert progress.step == ACC_STEPS + 1
