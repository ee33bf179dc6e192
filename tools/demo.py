"""`make demo`: a real checkpoint series through cowfs, then what it stored.

Creates a store in a temporary directory, trains a small transformer on the CPU
for a few steps at a time and saves checkpoints the way people do (torch.save
of the model, of model + AdamW state, and safetensors of a model whose backbone
is frozen), takes snapshots, and prints the stats, the snapshots and the
history of one file. Until the FUSE mount exists (issue 3) the checkpoints go
through the engine's Python API, not a mount point.
"""
from __future__ import annotations

import io
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save as safetensors_save

from cowfs.store import ROOT_INO, Store


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


def save_bytes(obj: object) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def cli(store: Path, *args: str) -> None:
    print(f"$ cowfs {' '.join(args)}", flush=True)
    subprocess.run([sys.executable, "-m", "cowfs.cli", *args], check=True)


def main() -> int:
    torch.manual_seed(0)
    tmp = Path(tempfile.mkdtemp(prefix="cowfs-demo-"))
    store_path = tmp / "store"
    try:
        Store.init(store_path, segment_size=64 << 20)
        model = TinyGPT()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        with Store.open(store_path) as store:
            run = store.mkdir(ROOT_INO, b"run1")
            for step in range(1, 5):
                loss = train_steps(model, opt, 2)
                t = time.monotonic()
                name = f"checkpoint-{step * 2}"
                ck = store.mkdir(run.ino, name.encode())
                full = save_bytes({"model": model.state_dict(), "optim": opt.state_dict(), "step": step * 2})
                store.write_file(f"/run1/{name}/full.pt", full)
                store.write_file(f"/run1/{name}/model.pt", save_bytes(model.state_dict()))
                store.write_file(f"/run1/{name}/trainer_state.json", f'{{"step": {step * 2}, "loss": {loss:.4f}}}'.encode())
                store.snapshot_create(f"step-{step * 2}")
                print(f"step {step * 2}: loss {loss:.3f}, saved {len(full) / 2**20:.1f} MiB + model in {time.monotonic() - t:.2f}s", flush=True)
                del ck
            # frozen backbone: only the head trains, so most chunks repeat
            for p in model.parameters():
                p.requires_grad_(False)
            model.head.weight.requires_grad_(True)
            head_opt = torch.optim.AdamW([model.head.weight], lr=1e-3)
            for step in range(1, 4):
                train_steps(model, head_opt, 1)
                store.write_file("/run1/frozen.safetensors", safetensors_save({k: v.contiguous() for k, v in model.state_dict().items()}))
            frozen = store.resolve("/run1/frozen.safetensors")
            print("\nhistory of /run1/frozen.safetensors (bytes each version added):")
            for v in store.history(frozen.ino):
                print(f"  generation {v.birth_gen}: size {v.size}, added {v.added_bytes}")
        print()
        cli(store_path, "stats", str(store_path))
        cli(store_path, "snapshot", "list", str(store_path))
        cli(store_path, "ls", str(store_path), "/run1/checkpoint-2", "--snapshot", "step-2")
        cli(store_path, "fsck", str(store_path))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
