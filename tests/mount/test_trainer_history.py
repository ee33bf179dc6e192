"""The real transformers.Trainer on a `--snapshot-on checkpoint` mount: a snapshot per
checkpoint, `cowfs checkpoints` finds the ones save_total_limit rotated away, `prune
--keep-best eval_loss 1` keeps the best, and restoring it gives the same bytes and a
checkpoint that resume_from_checkpoint resumes from."""
from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import pytest
import torch

from tests.mount.test_snapshot_on_checkpoint import sha_tree, snapshots, wait_snapshots
from tests.support.mountutil import cowfs, mounted

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.mount
STEPS, EVERY = 10, 2


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int, seed: int) -> None:
        self.x = torch.randint(0, 64, (n, 16), generator=torch.Generator().manual_seed(seed))

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.x[i], "labels": self.x[i]}


def trainer(out: Path, max_steps: int) -> "transformers.Trainer":
    """A 1-layer GPT-2 (defined here, nothing downloaded) that learns for 4 steps, then climbs
    (a negative learning rate), so the best eval_loss is early and rotated away."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=1, n_head=2)
    model = transformers.GPT2LMHeadModel(config)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 if step < 4 else -1.0)
    args = transformers.TrainingArguments(
        output_dir=str(out), max_steps=max_steps, save_steps=EVERY, eval_steps=EVERY, logging_steps=EVERY,
        eval_strategy="steps", save_total_limit=2, per_device_train_batch_size=8, per_device_eval_batch_size=8,
        report_to="none", use_cpu=True, dataloader_num_workers=0, seed=0, disable_tqdm=True)
    return transformers.Trainer(model=model, args=args, train_dataset=Tokens(64, 1), eval_dataset=Tokens(16, 2),
                                optimizers=(opt, sched))


class Hashes(transformers.TrainerCallback):  # type: ignore[misc]
    """Every checkpoint's files as the Trainer left them, hashed right after each save."""

    def __init__(self) -> None:
        self.saved: dict[int, dict[str, str]] = {}

    def on_save(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        self.saved[state.global_step] = sha_tree(Path(args.output_dir) / f"checkpoint-{state.global_step}")


def test_trainer_history_best_checkpoint_restore_and_resume(store_path, tmp_path):
    logging.getLogger("transformers").setLevel(logging.ERROR)
    with mounted(store_path, tmp_path / "mnt", "--snapshot-on", "checkpoint") as m:
        run = m / "run1"
        t = trainer(run, STEPS)
        hashes = Hashes()
        t.add_callback(hashes)
        t.train()
        steps = list(range(EVERY, STEPS + 1, EVERY))
        evals = {e["step"]: e["eval_loss"] for e in t.state.log_history if "eval_loss" in e}
        best = min(evals, key=evals.get)
        assert sorted(hashes.saved) == steps and best not in (STEPS - EVERY, STEPS)  # rotated away
        assert {p.name for p in run.glob("checkpoint-*")} == {f"checkpoint-{STEPS - EVERY}", f"checkpoint-{STEPS}"}

        # a snapshot per checkpoint, each with its checkpoint whole
        wait_snapshots(m, *(f"run1@step-{s}" for s in steps))
        for s in steps:
            assert sha_tree(m / ".snapshots" / f"run1@step-{s}" / "run1" / f"checkpoint-{s}") == hashes.saved[s]

        # every checkpoint, the rotated ones too, with the eval_loss the Trainer logged
        found = json.loads(cowfs("checkpoints", str(m), "--json").stdout)
        assert [c["step"] for c in found] == steps[::-1]
        for c in found:
            assert c["metrics"]["eval_loss"] == pytest.approx(evals[c["step"]]) and c["epoch"] is not None
            assert c["live"] == (c["step"] >= STEPS - EVERY) and c["snapshot"] == f"run1@step-{c['step']}"

        r = json.loads(cowfs("prune", str(m), "--keep-best", "eval_loss", "1", "--json").stdout)
        assert r["best"][0]["step"] == best and snapshots(m) == {f"run1@step-{best}"}
        # what is left: the live two, and what the kept snapshot holds (pinned before the rotation after its save)
        kept = {s for s in steps if best - 2 * EVERY <= s <= best}
        assert [c["step"] for c in json.loads(cowfs("checkpoints", str(m), "--json").stdout)] == \
            sorted(kept | {STEPS - EVERY, STEPS}, reverse=True)

        ckpt = f"/run1/checkpoint-{best}"
        cowfs("restore", str(m), ckpt, "--snapshot", f"run1@step-{best}")
        assert sha_tree(m / ckpt.lstrip("/")) == hashes.saved[best]

        resumed = trainer(m / "resumed", best + EVERY)
        resumed.train(resume_from_checkpoint=str(m / ckpt.lstrip("/")))
        assert resumed.state.global_step == best + EVERY
        trained_steps = [e["step"] for e in resumed.state.log_history if "loss" in e]
        assert trained_steps[-1] == best + EVERY and all(s <= best + EVERY for s in trained_steps)
        wait_snapshots(m, f"resumed@step-{best + EVERY}")
        state = json.loads((m / "resumed" / f"checkpoint-{best + EVERY}" / "trainer_state.json").read_text())
        # the log history carried over from the restored checkpoint: resumed there, not from scratch
        assert [e["step"] for e in state["log_history"] if "eval_loss" in e] == steps[: steps.index(best) + 2]
        assert hashlib.sha256((m / ckpt.lstrip("/") / "model.safetensors").read_bytes()).hexdigest() == \
            hashes.saved[best]["model.safetensors"]
