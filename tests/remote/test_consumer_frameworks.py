"""An evaluation server on another machine, as a consumer serves it: a training loop writes
HF-Trainer-style checkpoints (safetensors weights, a `torch.save` optimizer state, and
`trainer_state.json` last) through the producer's mount; the consumer's `cowfs watch`
reports each `trainer_state.json`, and at once the whole checkpoint loads bitwise through
the consumer's read-only mount: safetensors by `load_file` and lazily by `safe_open` (both
mmap the file), the optimizer by `torch.load(mmap=True)`. A checkpoint rotated away on the
producer disappears from the consumer and still loads from a snapshot there."""
from __future__ import annotations

import gc
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from tests.support.consumerutil import Consumer, Watch, drain, subscribed, wait_for
from tests.support.frameworkutil import assert_same
from tests.support.mountutil import cowfs, mounted, store_path  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.mount, pytest.mark.usefixtures("aws_env")]


def model_state(step: int) -> dict[str, torch.Tensor]:
    """A frozen embedding (the same bytes at every step) and layers that change every step."""
    g = torch.Generator().manual_seed(step)
    return {"embed.weight": torch.randn(512, 256, generator=torch.Generator().manual_seed(0)),
            "layer.weight": torch.randn(256, 256, generator=g),
            "layer.bias": torch.randn(256, generator=g),
            "head.weight": torch.randn(1000, 256, generator=g).to(torch.bfloat16)}


def optimizer_state(step: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(1000 + step)
    return {"state": {0: {"step": torch.tensor(float(step)), "exp_avg": torch.randn(256, 256, generator=g),
                          "exp_avg_sq": torch.rand(256, 256, generator=g)}},
            "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "params": [0]}]}


def save_checkpoint(run: Path, step: int) -> None:
    """What HF Trainer writes for a step, trainer_state.json last."""
    d = run / f"checkpoint-{step}"
    d.mkdir()
    save_file(model_state(step), str(d / "model.safetensors"), metadata={"format": "pt"})
    torch.save(optimizer_state(step), d / "optimizer.pt")
    (d / "trainer_state.json").write_text(json.dumps({"global_step": step}))


def check_loads(d: Path, step: int) -> None:
    """The checkpoint in `d` loads bitwise as saved; nothing of it stays mapped afterwards."""
    assert_same(model_state(step), load_file(str(d / "model.safetensors")), f"{d.name} weights")
    want = model_state(step)
    with safe_open(str(d / "model.safetensors"), framework="pt") as f:
        assert sorted(f.keys()) == sorted(want) and f.metadata() == {"format": "pt"}
        for name in reversed(sorted(want)):  # lazily, in another order than written
            assert_same(want[name], f.get_tensor(name), f"{d.name} {name}")
    got = torch.load(d / "optimizer.pt", mmap=True, weights_only=True)
    assert_same(optimizer_state(step), got, f"{d.name} optimizer")
    del got
    gc.collect()  # the mmap'd storages go before the mount is unmounted
    assert json.loads((d / "trainer_state.json").read_text()) == {"global_step": step}


def test_an_evaluation_server_loads_each_checkpoint_as_soon_as_the_watch_reports_it(store_path, tmp_path, rgw,
                                                                                     s3_bucket):
    url = f"s3://{s3_bucket.name}/train"
    cowfs("remote", "set", str(store_path), url, "--endpoint", rgw.credentials.endpoint, "--notify", "127.0.0.1:0")
    with mounted(store_path, tmp_path / "prod") as prod:
        run = prod / "run"
        run.mkdir()
        wait_for("first upload", lambda: json.loads(cowfs("remote", "status", str(prod), "--json").stdout)
                 ["catalog_generation"] > 0)
        with Consumer(url, rgw.credentials.endpoint, tmp_path / "cons", tmp_path / "cache") as cons:
            with Watch(cons) as seen:
                subscribed(prod, seen)
                for step in (1, 2, 3):
                    save_checkpoint(run, step)
                    drain(seen, lambda e, step=step: e.get("kind") == "version"
                          and e.get("path") == f"/run/checkpoint-{step}/trainer_state.json")
                    # everything closed before trainer_state.json is there: a consumer applies
                    # generations in order
                    check_loads(cons / "run" / f"checkpoint-{step}", step)
                    if step == 1:
                        cowfs("snapshot", "create", str(prod), "step-1")
            shutil.rmtree(run / "checkpoint-1")  # the Trainer's rotation
            wait_for("checkpoint-1 gone on the consumer", lambda: not (cons / "run" / "checkpoint-1").exists())
            snap = cons / ".snapshots" / "step-1" / "run" / "checkpoint-1"
            wait_for("the snapshot on the consumer", snap.exists)
            check_loads(snap, 1)
            assert sorted(p.name for p in (cons / "run").iterdir() if not p.name.startswith(".")) == [
                "checkpoint-2", "checkpoint-3"]
