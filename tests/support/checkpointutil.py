"""Helpers for checkpoint tests on a Store (no mount): HF-Trainer-like checkpoints written
with the engine's calls."""
from __future__ import annotations

import json
import pickle

from cowfs.store import ROOT_INO, Store

from tests.support.storeutil import data


def mkdirs(s: Store, path: str) -> None:
    parent = ROOT_INO
    for part in path.strip("/").split("/"):
        try:
            parent = s.lookup(parent, part.encode()).ino
        except Exception:
            parent = s.mkdir(parent, part.encode()).ino


def save(s: Store, run: str, step: int, eval_loss: float, seed: int | None = None) -> int:
    """An HF-Trainer-like checkpoint; returns the generation of its trainer_state.json commit."""
    ck = f"{run}/checkpoint-{step}"
    mkdirs(s, ck)
    s.write_file(f"{ck}/model.safetensors", data(50_000, step if seed is None else seed))
    s.write_file(f"{ck}/optimizer.pt", data(20_000, step + 1))
    state = {"global_step": step, "epoch": step / 100, "log_history": [
        {"loss": eval_loss + 0.1, "step": step, "epoch": step / 100}, {"eval_loss": eval_loss, "step": step}]}
    return s.write_file(f"{ck}/trainer_state.json", json.dumps(state).encode()).birth_gen


def lightning_save(s: Store, ckdir: str, name: str, seed: int) -> int:
    """A Lightning-like checkpoint: one file `ckdir/name` (torch.save's bytes stand-in); its commit's generation."""
    mkdirs(s, ckdir)
    return s.write_file(f"{ckdir}/{name}", data(30_000, seed)).birth_gen


def dcp_save(s: Store, ckpt: str, seed: int, ranks: int = 2) -> int:
    """A torch.distributed.checkpoint-like directory: `.distcp` files, then `.metadata` last
    (a pickle naming each rank's file, as DCP's storage_data does)."""
    mkdirs(s, ckpt)
    for r in range(ranks):
        s.write_file(f"{ckpt}/__{r}_0.distcp", data(20_000, seed + r))
    return s.write_file(f"{ckpt}/.metadata", dcp_metadata(ranks, seed)).birth_gen


def dcp_metadata(ranks: int, seed: int = 0) -> bytes:
    """A stand-in for DCP's pickled Metadata: each item's (relative path, offset, length)."""
    return pickle.dumps({"seed": seed, "storage_data": {f"rank{r}.w": (f"__{r}_0.distcp", 0, 20_000)
                                                        for r in range(ranks)}})


def deepspeed_save(s: Store, save_dir: str, tag: str, seed: int) -> int:
    """A DeepSpeed-like save: SAVE_DIR/TAG/ files, then SAVE_DIR/latest rewritten to TAG."""
    mkdirs(s, f"{save_dir}/{tag}")
    s.write_file(f"{save_dir}/{tag}/mp_rank_00_model_states.pt", data(20_000, seed))
    s.write_file(f"{save_dir}/{tag}/zero_pp_rank_0_mp_rank_00_optim_states.pt", data(20_000, seed + 1))
    return s.write_file(f"{save_dir}/latest", tag.encode()).birth_gen

def rmtree(s: Store, path: str) -> None:
    attr = s.resolve(path)
    for name, child in s.readdir(attr.ino):
        if child.is_dir:
            rmtree(s, f"{path}/{name.decode()}")
        else:
            s.unlink(attr.ino, name)
    head, _, name = path.rpartition("/")
    s.rmdir(s.resolve(head or "/").ino, name.encode())
