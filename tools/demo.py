"""`make demo`: a real checkpoint series through a cowfs mount, then what it stored.

Creates a store in a temporary directory and mounts it with `--snapshot-on checkpoint`.
A small transformer trains on the CPU, and the loop saves checkpoints into the mount the
way HF Trainer does: `checkpoint-N/` with model.safetensors, the AdamW state and
`trainer_state.json` (step, epoch, training and evaluation losses) last. It keeps the
newest two (`shutil.rmtree` of the oldest, like `save_total_limit=2`); the daemon takes a
snapshot `run1@step-N` as each checkpoint completes. Then it fine-tunes only the head and
saves again. Meanwhile `cowfs watch` prints each commit the daemon pushes. At the end it
lists every checkpoint (the rotated ones too) with `cowfs checkpoints`, shows which
snapshots `prune --keep-best eval_loss 1` would keep, and puts the best checkpoint back
with `cowfs restore`. After unmounting it shows `cowfs stats`, a diff between two
snapshots, a file's history and fsck.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import load_file as safetensors_load_file
from safetensors.torch import save_file as safetensors_save_file


class TinyGPT(torch.nn.Module):
    def __init__(self, vocab: int = 2048, dim: int = 256, layers: int = 4) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.blocks = torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(dim, 4, 4 * dim, batch_first=True) for _ in range(layers)
        )
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def eval_loss(model: TinyGPT, batch: torch.Tensor) -> float:
    with torch.no_grad():
        return float(torch.nn.functional.cross_entropy(model(batch[:, :-1]).flatten(0, 1), batch[:, 1:].flatten()))


def train_steps(model: TinyGPT, opt: torch.optim.Optimizer, steps: int, batch: torch.Tensor | None = None) -> float:
    loss = torch.tensor(0.0)
    for _ in range(steps):
        x = torch.randint(0, 2048, (8, 32)) if batch is None else batch
        loss = torch.nn.functional.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    return float(loss.detach())


def cli(*args: str) -> None:
    print(f"$ cowfs {' '.join(args)}", flush=True)
    subprocess.run([sys.executable, "-m", "cowfs.cli", *args], check=True)


def cli_json(*args: str) -> object:
    return json.loads(subprocess.run([sys.executable, "-m", "cowfs.cli", *args, "--json"], check=True,
                                     capture_output=True).stdout)


def save_checkpoint(ck: Path, model: TinyGPT, opt: torch.optim.Optimizer, step: int, log: list[dict]) -> None:
    """HF Trainer's layout and order: the weights, the optimizer, the scheduler, trainer_state.json last."""
    ck.mkdir()
    safetensors_save_file({k: v.contiguous() for k, v in model.state_dict().items()}, ck / "model.safetensors")
    torch.save(opt.state_dict(), ck / "optimizer.pt")
    torch.save({"step": step}, ck / "scheduler.pt")
    (ck / "trainer_state.json").write_text(json.dumps({"global_step": step, "epoch": step / 400, "log_history": log}))


def wait_for_snapshots(mnt: Path, names: list[str], deadline: float = 60.0) -> None:
    """The daemon takes them in the background, just after each checkpoint completes."""
    end = time.monotonic() + deadline
    while not set(names) <= set(os.listdir(mnt / ".snapshots")) and time.monotonic() < end:
        time.sleep(0.05)


def main() -> int:
    torch.manual_seed(0)
    tmp = Path(tempfile.mkdtemp(prefix="cowfs-demo-"))
    store, mnt = tmp / "store", tmp / "mnt"
    mnt.mkdir()
    try:
        cli("init", str(store), "--segment-size", "64M")
        cli("mount", str(store), str(mnt), "--snapshot-on", "checkpoint")
        watch = None
        try:
            out = mnt / "run1"
            out.mkdir()
            print(f"$ cowfs watch {mnt} /run1/checkpoint-200 &", flush=True)
            watch = subprocess.Popen([sys.executable, "-m", "cowfs.cli", "watch", str(mnt), "/run1/checkpoint-200"],
                                     stdin=subprocess.DEVNULL)
            model = TinyGPT()
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
            held_out = torch.randint(0, 2048, (8, 32))
            other_corpus = torch.randint(0, 64, (8, 32))
            log: list[dict] = []
            for step in (100, 200, 300, 400):
                # the first steps see the held-out batch, later ones another corpus (64 tokens): the best
                # checkpoint by eval_loss is an early one, which the rotation removes (transformers issue 15089)
                loss = train_steps(model, opt, 2, held_out if step <= 200 else other_corpus)
                log += [{"loss": round(loss, 4), "step": step}, {"eval_loss": round(eval_loss(model, held_out), 4), "step": step}]
                t = time.monotonic()
                save_checkpoint(out / f"checkpoint-{step}", model, opt, step, log)
                took = time.monotonic() - t
                kept = sorted(out.glob("checkpoint-*"), key=os.path.getmtime)
                for old in kept[:-2]:
                    shutil.rmtree(old)  # HF Trainer's rotation (save_total_limit=2)
                print(f"step {step}: loss {loss:.3f}, eval_loss {log[-1]['eval_loss']:.4f}, checkpoint saved in {took:.2f}s",
                      flush=True)
            wait_for_snapshots(mnt, [f"run1@step-{step}" for step in (100, 200, 300, 400)])
            # fine-tune only the head: most chunks of the next saves repeat
            for p in model.parameters():
                p.requires_grad_(False)
            model.head.weight.requires_grad_(True)
            head_opt = torch.optim.AdamW([model.head.weight], lr=1e-3)
            for step in (500, 600):
                loss = train_steps(model, head_opt, 1)
                safetensors_save_file({k: v.contiguous() for k, v in model.state_dict().items()}, out / "head-tuned.safetensors")
                print(f"step {step}: head-only fine-tune saved to run1/head-tuned.safetensors", flush=True)
            print("\nlive tree:", sorted(p.name for p in out.iterdir()))
            print("snapshots (one per checkpoint, taken by the daemon):", sorted(os.listdir(mnt / ".snapshots")))
            first = mnt / ".snapshots" / "run1@step-100" / "run1" / "checkpoint-100" / "model.safetensors"
            restored = safetensors_load_file(first)
            print(f"checkpoint-100 was removed from the live tree; its snapshot still loads: {len(restored)} tensors")
            cli("snapshot", "list", str(mnt))
            cli("checkpoints", str(mnt))
            cli("prune", str(mnt), "--keep-best", "eval_loss", "1", "--dry-run")
            best = cli_json("checkpoints", str(mnt), "--sort", "eval_loss")[0]  # type: ignore[index]
            if not best["live"]:
                cli("restore", str(mnt), best["snapshot_path"], "--snapshot", best["snapshot"])
                print("live tree:", sorted(p.name for p in out.iterdir()),
                      f"(Trainer(...).train(resume_from_checkpoint='{mnt}{best['snapshot_path']}') resumes from it)")
        finally:
            cli("umount", str(mnt))
            if watch is not None:
                try:
                    watch.wait(30)  # the unmount ends it
                except subprocess.TimeoutExpired:
                    watch.kill()
                    watch.wait()
        cli("stats", str(store))
        cli("diff", str(store), "run1@step-300", "run1@step-400")
        cli("log", str(store), "/run1/head-tuned.safetensors")
        cli("fsck", str(store))
    finally:
        if os.path.ismount(mnt):
            subprocess.run(["fusermount3", "-u", "-z", str(mnt)], check=False)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
