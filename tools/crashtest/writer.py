"""The writer process (`python -m tools.crashtest _writer ...`): saves real checkpoints into
MNT/run in a loop the way training code does, and logs what it does.

Each step: (a) torch.save over a fixed `model.pt` (now and then first a rollback to one of
the last 3 steps' weights), (b) safetensors save_file to a temporary name + os.replace onto
`model.safetensors`, (d) with --overwrite-safetensors save_file straight over
`model-direct.safetensors`, (c) an HF-style `checkpoint-N/` directory (trainer_state.json
last), rotated to keep the newest KEEP_CHECKPOINTS.

Before it opens a file it logs a `begin` record with the sha256 of the bytes it is about to
write; once close() has returned it logs `closed`. Records carry a CLOCK_MONOTONIC time and go
to a JSON-lines file on a non-cowfs path (fsynced each) and to stdout (the harness's pipe).
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import random
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors.torch import save as st_save
from safetensors.torch import save_file as st_save_file

from .states import RUN, SAVE_FILE_TMP

KEEP_CHECKPOINTS = 2
StateDict = dict[str, torch.Tensor]


class RecordLog:
    """The writer's records: one JSON line each, stamped with CLOCK_MONOTONIC, appended and
    fsynced to a file on a non-cowfs path, and written to stdout."""

    def __init__(self, path: str) -> None:
        self.file = open(path, "a")

    def record(self, ev: str, **kw: Any) -> None:
        line = json.dumps({"ev": ev, "t": time.monotonic(), **kw})
        self.file.write(line + "\n")
        self.file.flush()
        os.fsync(self.file.fileno())
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


class Net(torch.nn.Module):
    """A ~3 MB model (3.2 MB of weights)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(1024, 256)
        self.body = torch.nn.ModuleList(torch.nn.Linear(256, 256) for _ in range(6))
        self.head = torch.nn.Linear(256, 512)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x).mean(1)
        for layer in self.body:
            h = h + torch.relu(layer(h))
        return self.head(h)


def build_model() -> Net:
    """Same initial weights in every cycle, about half of them frozen: those chunks dedup."""
    torch.manual_seed(1234)
    model = Net()
    for mod in (model.embed, *model.body[:3]):  # ~1.8 MB of 3.2 MB frozen
        for p in mod.parameters():
            p.requires_grad_(False)
    return model


def torch_bytes(obj: Any, scratch: Path, name: str, how: str) -> bytes:
    """The exact bytes torch.save writes: through a path the zip's root folder is the
    file's stem, through a file object it is 'archive'."""
    if how == "path":
        p = scratch / name
        torch.save(obj, str(p))
        return p.read_bytes()
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def self_check(model: Net, scratch: Path) -> None:
    """On a non-cowfs path: the bytes computed up front are the bytes written."""
    sd = model.state_dict()
    for how in ("path", "file"):
        want = torch_bytes(sd, scratch, "model.pt", how)
        q = scratch / "selfcheck" / "model.pt"
        q.parent.mkdir(exist_ok=True)
        if how == "path":
            torch.save(sd, str(q))
        else:
            with open(q, "wb") as f:
                torch.save(sd, f)
        if q.read_bytes() != want:
            raise SystemExit(f"torch.save ({how}) is not deterministic here; the harness cannot predict its bytes")
    tens = {k: v.contiguous() for k, v in sd.items()}
    st_save_file(tens, str(scratch / "selfcheck" / "m.st"), metadata={"step": "0"})
    if (scratch / "selfcheck" / "m.st").read_bytes() != st_save(tens, metadata={"step": "0"}):
        raise SystemExit("safetensors save_file and save differ; the harness cannot predict the bytes")


def warm_up(model: Net) -> None:
    """The first optimizer step imports torch._dynamo (~1.5 s): done before reporting ready."""
    dummy = torch.nn.Parameter(torch.zeros(4))
    warm = torch.optim.AdamW([dummy], lr=1e-3)
    torch.nn.functional.cross_entropy(model(torch.zeros(2, 8, dtype=torch.long)), torch.zeros(2, dtype=torch.long))
    dummy.sum().backward()
    warm.step()


def alive_check(p: Path) -> None:
    """Libraries that write through their own descriptor (torch's C++ writer, the Rust
    safetensors writer) ignore close() errors. An open() is always a request to the
    daemon: it fails once the connection is gone, so a close that failed because the
    daemon died is never reported as returned."""
    os.close(os.open(p, os.O_RDONLY))


class CheckpointSaver:
    """Every change the writer makes under MNT/run, each between its two records."""

    def __init__(self, root: Path, scratch: Path, log: RecordLog, rng: random.Random) -> None:
        self.root = root
        self.scratch = scratch
        self.log = log
        self.rng = rng

    def rel(self, p: Path) -> str:
        return f"{RUN}/{p.relative_to(self.root)}" if p != self.root else RUN

    def save(self, p: Path, data: bytes, step: int, how: str, write: Callable[[], None]) -> None:
        digest = hashlib.sha256(data).hexdigest()
        self.log.record("begin", path=self.rel(p), sha=digest, size=len(data), step=step, how=how)
        write()
        self.log.record("closed", path=self.rel(p), sha=digest, size=len(data), step=step)

    def save_torch(self, p: Path, obj: Any, step: int) -> None:
        how = self.rng.choice(("path", "file"))
        data = torch_bytes(obj, self.scratch, p.name, how)

        def write() -> None:
            if how == "path":
                torch.save(obj, str(p))  # std::ofstream: open(O_WRONLY|O_CREAT|O_TRUNC)
                alive_check(p)
            else:
                with open(p, "wb") as f:  # Python raises if close() fails
                    torch.save(obj, f)
                    f.flush()
                    self.log.record("closing", path=self.rel(p), step=step)

        self.save(p, data, step, f"torch.save/{how}", write)

    def save_safetensors(self, p: Path, tensors: StateDict, step: int) -> None:
        meta = {"step": str(step)}
        data = st_save(tensors, metadata=meta)

        def write() -> None:
            st_save_file(tensors, str(p), metadata=meta)
            alive_check(p)

        self.save(p, data, step, "save_file", write)

    def save_text(self, p: Path, text: str, step: int) -> None:
        data = text.encode()

        def write() -> None:
            with open(p, "wb") as f:
                f.write(data)
                f.flush()
                self.log.record("closing", path=self.rel(p), step=step)

        self.save(p, data, step, "write", write)

    def replace(self, src: Path, dst: Path, step: int) -> None:
        self.log.record("rename_begin", src=self.rel(src), dst=self.rel(dst), step=step)
        os.replace(src, dst)
        self.log.record("renamed", src=self.rel(src), dst=self.rel(dst), step=step)

    def mkdir(self, d: Path, step: int) -> None:
        self.log.record("mkdir_begin", path=self.rel(d), step=step)
        d.mkdir()
        self.log.record("mkdir_done", path=self.rel(d), step=step)

    def rotate_checkpoints(self, step: int) -> None:
        """Keep the newest KEEP_CHECKPOINTS checkpoint-N directories, as HF's Trainer does."""
        cks = sorted((int(n.split("-", 1)[1]), n) for n in os.listdir(self.root)
                     if n.startswith("checkpoint-") and n.split("-", 1)[1].isdigit())
        for _, name in cks[:-KEEP_CHECKPOINTS]:
            self.log.record("rmtree_begin", path=self.rel(self.root / name), step=step)
            shutil.rmtree(self.root / name)
            self.log.record("rmtree_done", path=self.rel(self.root / name), step=step)

    def remove_stale_temporaries(self) -> None:
        """The temporaries a killed run left behind."""
        for name in sorted(os.listdir(self.root)):
            if ".tmp." in name or SAVE_FILE_TMP.fullmatch(name):
                self.log.record("unlink_begin", path=self.rel(self.root / name))
                os.unlink(self.root / name)
                self.log.record("unlinked", path=self.rel(self.root / name))


def save_step(saver: CheckpointSaver, step: int, sd: StateDict, opt: torch.optim.Optimizer, loss: float,
              recent: list[StateDict], overwrite_safetensors: bool) -> None:
    """One step's checkpoints: (a), (b), (d) if asked, (c) and the rotation. `recent` (the last
    3 state dicts saved to model.pt, copied) gets this step's."""
    root = saver.root
    tensors = {k: v.contiguous() for k, v in sd.items()}
    # (a) in-place rewrite of a fixed path. Now and then first a rollback: an earlier step's
    # weights again, whose chunks may by now belong only to dead versions: the save dedups
    # against chunks an in-mount prune/gc may be deciding about
    if recent and saver.rng.random() < 0.2:
        saver.save_torch(root / "model.pt", saver.rng.choice(recent), step)
    saver.save_torch(root / "model.pt", sd, step)
    recent[:] = (recent + [{k: v.clone() for k, v in sd.items()}])[-3:]
    # (b) write to a temporary name, then rename over the live file
    tmp = root / f"model.safetensors.tmp.{step}"
    saver.save_safetensors(tmp, tensors, step)
    saver.replace(tmp, root / "model.safetensors", step)
    if overwrite_safetensors:  # (d) save_file straight over the previous file
        saver.save_safetensors(root / "model-direct.safetensors", tensors, step)
    # (c) HF Trainer layout, trainer_state.json last, then rotation
    ck = root / f"checkpoint-{step}"
    saver.mkdir(ck, step)
    saver.save_safetensors(ck / "model.safetensors", tensors, step)
    saver.save_torch(ck / "optimizer.pt", opt.state_dict(), step)
    state = {"global_step": step, "loss": loss, "best_model_checkpoint": None,
             "log_history": [{"step": step, "loss": loss}]}
    saver.save_text(ck / "trainer_state.json", json.dumps(state, indent=2), step)
    saver.rotate_checkpoints(step)


def train_step(model: Net, opt: torch.optim.Optimizer) -> float:
    x = torch.randint(0, 1024, (16, 8))
    y = torch.randint(0, 512, (16,))
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return round(float(loss.detach()), 6)


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m tools.crashtest _writer")
    ap.add_argument("--root", required=True)  # MNT/run
    ap.add_argument("--log", required=True)  # JSON-lines file on a non-cowfs path
    ap.add_argument("--scratch", required=True)  # non-cowfs directory for the self-check
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--ppid", type=int, required=True)
    ap.add_argument("--overwrite-safetensors", action="store_true")
    return ap.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    root, scratch = Path(args.root), Path(args.scratch)
    scratch.mkdir(parents=True, exist_ok=True)
    log = RecordLog(args.log)
    saver = CheckpointSaver(root, scratch, log, random.Random(args.seed))
    model = build_model()
    self_check(model, scratch)
    warm_up(model)
    log.record("ready", pid=os.getpid())
    go = sys.stdin.readline().split()  # "go STEP0" once its cycle starts
    if len(go) != 2 or go[0] != "go":
        return 0
    step = int(go[1])
    log.record("started", step0=step)
    # resume from the last checkpoint like a restarted job (the harness checked it loads)
    if (root / "model.pt").exists() and (root / "model.pt").stat().st_size > 0:
        model.load_state_dict(torch.load(root / "model.pt", map_location="cpu", weights_only=True))
    saver.remove_stale_temporaries()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    recent: list[StateDict] = []  # copies of the last state dicts: a rollback saves one again
    while os.getppid() == args.ppid:  # the harness is gone: stop
        loss = train_step(model, opt)
        sd = model.state_dict()
        save_step(saver, step, sd, opt, loss, recent, args.overwrite_safetensors)
        step += 1
    return 0
