"""What the real-framework mount tests share: an offline, quiet environment for the training
libraries that puts their process-wide state back afterwards, bitwise state comparison,
file digests, and snapshots taken with the `cowfs snapshot create` command."""
from __future__ import annotations

import copy
import hashlib
import logging
import os
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch

from tests.support.mountutil import cowfs

# nothing may reach the network: no hub look-ups, telemetry, experiment trackers; gloo on loopback
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "DO_NOT_TRACK": "1",
    "WANDB_MODE": "disabled",
    "WANDB_DISABLED": "true",
    "TOKENIZERS_PARALLELISM": "false",
    "GLOO_SOCKET_IFNAME": "lo",
}

# the libraries' INFO lines ("GPU available: False", "Deleting 1 checkpoints", ...)
QUIET_LOGGERS = ("transformers", "accelerate", "lightning", "lightning.pytorch", "lightning.fabric",
                 "pytorch_lightning", "torch.distributed")


def quiet_loggers() -> None:
    """The libraries' loggers at ERROR. Lightning sets its level when imported: call this again
    after importing a library (framework_env puts the levels back after the test)."""
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)


def reset_accelerate_state() -> None:
    """accelerate keeps its state in class-level singletons (transformers.Trainer uses them too):
    clear them so the next Accelerator starts from nothing."""
    if "accelerate.state" not in sys.modules:
        return
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


@pytest.fixture
def framework_env(tmp_path: Path) -> Iterator[None]:
    """Offline and quiet for one test; afterwards os.environ, the loggers' levels, torch's RNG
    and thread count, accelerate's singletons and the default process group are as before."""
    saved_env = dict(os.environ)
    os.environ.update(OFFLINE_ENV)
    os.environ["HF_HOME"] = str(tmp_path / "hf-home")  # any cache stays in the test's tmp dir
    levels = {name: logging.getLogger(name).level for name in QUIET_LOGGERS}
    quiet_loggers()
    rng, threads = torch.random.get_rng_state(), torch.get_num_threads()
    reset_accelerate_state()
    try:
        yield
    finally:
        reset_accelerate_state()
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
        torch.random.set_rng_state(rng)
        torch.set_num_threads(threads)
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
        os.environ.clear()
        os.environ.update(saved_env)


def tensor_bytes(t: torch.Tensor) -> bytes:
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def assert_same(want: Any, got: Any, where: str = "state") -> None:
    """`got` equals `want` through dicts, lists and tuples; tensors bitwise (dtype, shape, bytes)."""
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), f"{where}: a {type(got).__name__}, not a tensor"
        assert (got.dtype, tuple(got.shape)) == (want.dtype, tuple(want.shape)), (
            f"{where}: {got.dtype}{tuple(got.shape)}, want {want.dtype}{tuple(want.shape)}")
        assert tensor_bytes(got) == tensor_bytes(want), f"{where}: the values differ"
    elif isinstance(want, dict):
        assert isinstance(got, dict), f"{where}: a {type(got).__name__}, not a dict"
        assert sorted(map(str, got)) == sorted(map(str, want)), f"{where}: keys {sorted(map(str, got))}, want {sorted(map(str, want))}"
        for key in want:
            assert_same(want[key], got[key], f"{where}[{key!r}]")
    elif isinstance(want, (list, tuple)):
        assert isinstance(got, (list, tuple)) and len(got) == len(want), f"{where}: {got!r}, want {want!r}"
        for i, (w, g) in enumerate(zip(want, got)):
            assert_same(w, g, f"{where}[{i}]")
    else:
        assert got == want, f"{where}: {got!r}, want {want!r}"


def frozen(obj: Any) -> Any:
    """A deep copy (tensors cloned) of a state as it is now."""
    return copy.deepcopy(obj)


def digests(root: Path) -> dict[str, str]:
    """sha256 of every regular file under `root`, by path relative to it."""
    out = {}
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            p = Path(dirpath) / name
            out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def snapshot(mnt: Path, name: str) -> Path:
    """`cowfs snapshot create MNT NAME`, as a user runs it; returns where the snapshot is seen."""
    cowfs("snapshot", "create", str(mnt), name)
    return mnt / ".snapshots" / name


def by_number(names: list[str]) -> list[str]:
    """checkpoint-2, checkpoint-10 (or checkpoint_2, ...) in numeric order."""
    return sorted(names, key=lambda n: int(n.replace("_", "-").rsplit("-", 1)[1]))


__all__ = ["OFFLINE_ENV", "assert_same", "by_number", "digests", "framework_env", "frozen", "quiet_loggers",
           "reset_accelerate_state", "snapshot", "tensor_bytes"]
