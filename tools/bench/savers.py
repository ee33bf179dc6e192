"""The ways a checkpoint is saved, each timed the same way.

`seconds` runs from the first byte to the moment the save is finished (durable,
for the methods that promise it); `durable_seconds` is the part after the
serializer returned: fsync + close (+ rename + directory fsync), i.e. "time from
close() to durable". Plain saves promise nothing, so they have no durable part.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors.torch import save_file

from .workloads import Workload


@dataclass
class SaveResult:
    seconds: float
    durable_seconds: float | None
    bytes: int
    spilled: int | None = None  # cowfs: bytes in the session's spill file just before fsync (see mounting.spilled_bytes)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def cowfs_torch(obj: Any, path: Path, probe: Callable[[], int] | None = None) -> SaveResult:
    """torch.save into the mount, then fsync + close: the version is durable when they return.
    `probe` runs between the two (outside the timing)."""
    t0 = time.perf_counter()
    f = open(path, "wb")
    spilled = None
    try:
        torch.save(obj, f)
        f.flush()
        t1 = time.perf_counter()
        if probe is not None:
            spilled = probe()
            t0 += time.perf_counter() - t1
            t1 = time.perf_counter()
        os.fsync(f.fileno())
    finally:
        f.close()
    t2 = time.perf_counter()
    return SaveResult(t2 - t0, t2 - t1, path.stat().st_size, spilled)


def plain_torch(obj: Any, path: Path) -> SaveResult:
    """(a) torch.save to a plain directory: returns once the bytes are in the page cache."""
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        torch.save(obj, f)
    return SaveResult(time.perf_counter() - t0, None, path.stat().st_size)


def safe_torch(obj: Any, path: Path) -> SaveResult:
    """(b) the safe pattern: torch.save to a temp file, fsync, close, rename, fsync the directory."""
    tmp = path.with_name(f".{path.name}.tmp")
    t0 = time.perf_counter()
    f = open(tmp, "wb")
    try:
        torch.save(obj, f)
        f.flush()
        t1 = time.perf_counter()
        os.fsync(f.fileno())
    finally:
        f.close()
    os.replace(tmp, path)
    fsync_dir(path.parent)
    t2 = time.perf_counter()
    return SaveResult(t2 - t0, t2 - t1, path.stat().st_size)


def plain_safetensors(flat: dict[str, torch.Tensor], path: Path) -> SaveResult:
    """(c) safetensors save_file, nothing more."""
    t0 = time.perf_counter()
    save_file(flat, str(path))
    return SaveResult(time.perf_counter() - t0, None, path.stat().st_size)


def durable_safetensors(flat: dict[str, torch.Tensor], path: Path) -> SaveResult:
    """(c') safetensors save_file, then fsync of the file and of its directory."""
    t0 = time.perf_counter()
    save_file(flat, str(path))
    t1 = time.perf_counter()
    fsync_path(path)
    fsync_dir(path.parent)
    t2 = time.perf_counter()
    return SaveResult(t2 - t0, t2 - t1, path.stat().st_size)


@dataclass(frozen=True)
class Baseline:
    name: str
    saves: str  # "torch": the torch.save object; "flat": the tensors by name
    fn: Callable[[Any, Path], SaveResult]
    filename: str  # under the baseline directory; {k} is the checkpoint number


# the baselines of issue 6; (a) keeps every checkpoint: the plain directory's history
BASELINES = {b.name: b for b in (
    Baseline("a:torch.save", "torch", plain_torch, "a/step-{k}.pt"),
    Baseline("b:safe torch.save", "torch", safe_torch, "b/model.pt"),
    Baseline("c:safetensors", "flat", plain_safetensors, "c/model.safetensors"),
    Baseline("c:safetensors+fsync", "flat", durable_safetensors, "c/model-fsync.safetensors"),
)}


def save_hf(run_dir: Path, wl: Workload, durable: bool, keep: int | None = 2, name: str | None = None) -> SaveResult:
    """What HF Trainer writes at a save step (trainer_state.json last), then its rotation:
    `shutil.rmtree` of the oldest checkpoint-N/ beyond `keep` (None: no rotation).
    `durable`: fsync every file and the directories (HF itself does not)."""
    ck = run_dir / (name or f"checkpoint-{wl.step}")
    t0 = time.perf_counter()
    ck.mkdir()
    files = {
        "model.safetensors": lambda p: save_file(wl.model_tensors(), str(p)),
        "optimizer.pt": lambda p: torch.save(wl.opt.state_dict(), p),
        "scheduler.pt": lambda p: torch.save({"last_epoch": wl.step, "lr": [1e-4]}, p),
        "rng_state.pth": lambda p: torch.save({"cpu": torch.get_rng_state()}, p),
        "trainer_state.json": lambda p: p.write_text(json.dumps({"global_step": wl.step, "loss": wl.loss})),
    }
    durable_time = 0.0
    for name, write in files.items():
        write(ck / name)
        if durable:
            t = time.perf_counter()
            fsync_path(ck / name)
            durable_time += time.perf_counter() - t
    if durable:
        t = time.perf_counter()
        fsync_dir(ck)
        fsync_dir(run_dir)
        durable_time += time.perf_counter() - t
    size = sum(p.stat().st_size for p in ck.iterdir())
    if keep is not None:
        old = sorted(run_dir.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
        for stale in old[:-keep]:
            shutil.rmtree(stale)  # part of HF's save step, so inside the timing
        if durable and old[:-keep]:
            fsync_dir(run_dir)
    seconds = time.perf_counter() - t0
    return SaveResult(seconds, durable_time if durable else None, size)


def du(path: Path) -> int:
    """Bytes allocated on the disk under `path` (st_blocks)."""
    total = 0
    for root, _dirs, names in os.walk(path):
        for n in names:
            total += os.lstat(os.path.join(root, n)).st_blocks * 512
    return total
