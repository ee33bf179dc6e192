"""`make demo`: a real checkpoint series through a cowfs mount, then what it stored.

Creates a store in a temporary directory and mounts it. A small transformer
trains on the CPU, and the loop saves checkpoints into the mount the way people
do: torch.save of model + AdamW state and safetensors of the model, in HF
Trainer's `checkpoint-N/` layout with `trainer_state.json` last. It keeps the
newest two (`shutil.rmtree` of the oldest) and takes a snapshot with
`mkdir .snapshots/NAME` after each save. Then it fine-tunes only the head and
saves again. At the end it shows the snapshot directories, where removed
checkpoints are still readable. Meanwhile `cowfs watch` prints each commit the
daemon pushes. After unmounting it shows `cowfs stats`, a diff between two
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


def train_steps(model: TinyGPT, opt: torch.optim.Optimizer, steps: int) -> float:
    loss = torch.tensor(0.0)
    for _ in range(steps):
        x = torch.randint(0, 2048, (8, 32))
        loss = torch.nn.functional.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    return float(loss.detach())


def cli(*args: str) -> None:
    print(f"$ cowfs {' '.join(args)}", flush=True)
    subprocess.run([sys.executable, "-m", "cowfs.cli", *args], check=True)


def save_checkpoint(ck: Path, model: TinyGPT, opt: torch.optim.Optimizer, step: int, loss: float) -> None:
    ck.mkdir()
    safetensors_save_file({k: v.contiguous() for k, v in model.state_dict().items()}, ck / "model.safetensors")
    torch.save(opt.state_dict(), ck / "optimizer.pt")
    torch.save({"step": step}, ck / "scheduler.pt")
    (ck / "trainer_state.json").write_text(json.dumps({"global_step": step, "loss": loss}))


def main() -> int:
    torch.manual_seed(0)
    tmp = Path(tempfile.mkdtemp(prefix="cowfs-demo-"))
    store, mnt = tmp / "store", tmp / "mnt"
    mnt.mkdir()
    try:
        cli("init", str(store), "--segment-size", "64M")
        cli("mount", str(store), str(mnt))
        watch = None
        try:
            out = mnt / "run1"
            out.mkdir()
            print(f"$ cowfs watch {mnt} /run1/checkpoint-200 &", flush=True)
            watch = subprocess.Popen([sys.executable, "-m", "cowfs.cli", "watch", str(mnt), "/run1/checkpoint-200"],
                                     stdin=subprocess.DEVNULL)
            model = TinyGPT()
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
            for step in (100, 200, 300, 400):
                loss = train_steps(model, opt, 2)
                t = time.monotonic()
                save_checkpoint(out / f"checkpoint-{step}", model, opt, step, loss)
                took = time.monotonic() - t
                kept = sorted(out.glob("checkpoint-*"), key=os.path.getmtime)
                for old in kept[:-2]:
                    shutil.rmtree(old)  # HF Trainer's rotation
                (mnt / ".snapshots" / f"step-{step}").mkdir()
                print(f"step {step}: loss {loss:.3f}, checkpoint saved in {took:.2f}s, snapshot step-{step}", flush=True)
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
            print("snapshots:", sorted(os.listdir(mnt / ".snapshots")))
            first = mnt / ".snapshots" / "step-100" / "run1" / "checkpoint-100" / "model.safetensors"
            restored = safetensors_load_file(first)
            print(f"checkpoint-100 was removed from the live tree; its snapshot still loads: {len(restored)} tensors")
        finally:
            cli("umount", str(mnt))
            if watch is not None:
                try:
                    watch.wait(30)  # the unmount ends it
                except subprocess.TimeoutExpired:
                    watch.kill()
                    watch.wait()
        cli("stats", str(store))
        cli("diff", str(store), "step-300", "step-400")
        cli("log", str(store), "/run1/head-tuned.safetensors")
        cli("fsck", str(store))
    finally:
        if os.path.ismount(mnt):
            subprocess.run(["fusermount3", "-u", "-z", str(mnt)], check=False)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
