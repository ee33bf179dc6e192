"""ML frameworks' checkpoint I/O through a real mount: torch, safetensors, numpy,
an HF-Trainer-like save/rotate loop with snapshots, a Lightning-like move + last.ckpt
symlink, torch.distributed.checkpoint, and dedup of unchanged re-saves."""
from __future__ import annotations

import gc
import hashlib
import json
import os
import random
import shutil
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from cowfs.store import Store
from tests.support.mountutil import mounted

pytestmark = pytest.mark.mount

MB = 1 << 20
MAX_CHUNK = 256 << 10  # cowfs.store.data.chunking.MAX_CHUNK: the slop of a re-chunked region's edges


# -- a small real model ----------------------------------------------------------------


class TinyLM(nn.Module):
    """A 2-layer transformer LM: embedding 8 MB, encoder ~6.3 MB, head ~1 MB (fp32)."""

    def __init__(self, vocab: int = 8000, d: int = 256, head_out: int = 1024) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        layer = nn.TransformerEncoderLayer(d, 4, 4 * d, batch_first=True, dropout=0.0)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, head_out)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.encoder(self.embed(tokens))))


def make_model(seed: int = 0) -> TinyLM:
    torch.manual_seed(seed)
    model = TinyLM()
    with torch.no_grad():  # TransformerEncoder deep-copies one layer: make the layers differ (no dedup between them)
        for p in model.encoder.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    return model


def state_bytes(sd: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in sd.values())


def assert_state_equal(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        if isinstance(a[k], torch.Tensor):
            assert isinstance(b[k], torch.Tensor) and a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
            assert torch.equal(a[k], b[k]), k
        elif isinstance(a[k], dict):
            assert_state_equal(a[k], b[k])
        else:
            assert a[k] == b[k], k


def sha(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def release_mappings() -> None:
    """Drop mmap-backed tensors/arrays before the mount goes away."""
    gc.collect()


# -- 1. torch.save / torch.load -------------------------------------------------------------


def test_torch_save_load_and_mmap(store_path, tmp_path):
    model = make_model(1)
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    assert 10 * MB < state_bytes(sd) < 20 * MB
    with mounted(store_path, tmp_path / "mnt") as m:
        (m / "run").mkdir()
        path = m / "run" / "model.pt"
        torch.save(model.state_dict(), path)
        assert os.path.getsize(path) > state_bytes(sd)

        plain = torch.load(path, weights_only=True)
        assert_state_equal(sd, plain)
        mapped = torch.load(path, mmap=True, weights_only=True)
        assert_state_equal(sd, mapped)
        fresh = TinyLM()
        fresh.load_state_dict(mapped)
        assert_state_equal(sd, fresh.state_dict())
        del mapped, fresh
        release_mappings()

        # overwrite in place (O_TRUNC, as torch.save does) with a changed model
        with torch.no_grad():
            model.head.weight.add_(1.0)
        sd2 = {k: v.clone() for k, v in model.state_dict().items()}
        torch.save(model.state_dict(), path)
        assert_state_equal(sd2, torch.load(path, weights_only=True))
        mapped = torch.load(path, mmap=True, weights_only=True)
        assert_state_equal(sd2, mapped)
        del mapped
        release_mappings()
    with mounted(store_path, tmp_path / "mnt") as m:  # and after a remount
        mapped = torch.load(m / "run" / "model.pt", mmap=True, weights_only=True)
        assert_state_equal(sd2, mapped)
        del mapped
        release_mappings()


# -- 2. safetensors, written the way HF does (temp file + rename) --------------------------


def save_safetensors_atomic(sd: dict[str, torch.Tensor], final: Path) -> None:
    tmp = final.parent / f".{final.name}.tmp-{os.getpid()}-{random.randrange(1 << 30)}"
    save_file(sd, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, final)


def test_safetensors_atomic_replace_and_safe_open(store_path, tmp_path):
    model = make_model(2)
    sd = {k: v.clone().contiguous() for k, v in model.state_dict().items()}
    with mounted(store_path, tmp_path / "mnt") as m:
        d = m / "hf-model"
        d.mkdir()
        final = d / "model.safetensors"
        save_safetensors_atomic(sd, final)
        assert sorted(os.listdir(d)) == ["model.safetensors"]
        assert_state_equal(sd, load_file(str(final)))

        # a second save replaces the existing file through the rename
        sd2 = {k: (v + 1 if k.startswith("head.") else v).contiguous() for k, v in sd.items()}
        save_safetensors_atomic(sd2, final)
        assert sorted(os.listdir(d)) == ["model.safetensors"]
        assert_state_equal(sd2, load_file(str(final)))

        with safe_open(str(final), framework="pt") as f:
            assert f.metadata() == {"format": "pt"}
            assert sorted(f.keys()) == sorted(sd2)
            for k in reversed(sorted(sd2)):  # individual tensors, out of file order
                assert torch.equal(f.get_tensor(k), sd2[k]), k
            sl = f.get_slice("embed.weight")
            assert torch.equal(sl[100:200], sd2["embed.weight"][100:200])
        release_mappings()


# -- 3. numpy ------------------------------------------------------------------------------------


def test_numpy_save_load_mmap(store_path, tmp_path):
    rng = np.random.default_rng(3)
    arrays = {
        "weights.npy": rng.standard_normal((1024, 2048), dtype=np.float32),  # 8 MB
        "ids.npy": rng.integers(0, 1 << 40, size=300_000, dtype=np.int64),
        "half.npy": rng.standard_normal((333, 777)).astype(np.float16),  # odd size
    }
    with mounted(store_path, tmp_path / "mnt") as m:
        for name, a in arrays.items():
            np.save(m / name, a)
        for name, a in arrays.items():
            got = np.load(m / name)
            assert got.dtype == a.dtype and got.shape == a.shape and np.array_equal(got, a)
            mm = np.load(m / name, mmap_mode="r")
            assert isinstance(mm, np.memmap) and np.array_equal(mm, a)
            assert np.array_equal(mm[-7:], a[-7:])  # the tail page
            del mm
        release_mappings()


# -- 4. an HF-Trainer-like loop: checkpoint, rotate by mtime, snapshot -----------------------------


KEEP = 3


def hf_save_checkpoint(ckpt: Path, model: nn.Module, opt, sched, step: int, log_history: list) -> None:
    ckpt.mkdir()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(ckpt / "model.safetensors"),
              metadata={"format": "pt"})
    torch.save(opt.state_dict(), ckpt / "optimizer.pt")
    torch.save(sched.state_dict(), ckpt / "scheduler.pt")
    torch.save({"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.random.get_rng_state()},
               ckpt / "rng_state.pth")
    state = {"global_step": step, "epoch": step / 600, "log_history": log_history,
             "best_model_checkpoint": None, "trial_name": None}
    (ckpt / "trainer_state.json").write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")  # last


def hf_rotate(out: Path, keep: int) -> list[str]:
    ckpts = [str(p) for p in out.glob("checkpoint-*")]
    ckpts.sort(key=os.path.getmtime)
    for c in ckpts[:-keep]:
        shutil.rmtree(c)
    return [os.path.basename(c) for c in ckpts[:-keep]]


def test_hf_trainer_like_rotation_snapshots_dedup(store_path, tmp_path):
    model = make_model(4)
    for name, p in model.named_parameters():
        p.requires_grad_(name.startswith("head."))  # frozen backbone: only the head trains
    trainable = [p for p in model.parameters() if p.requires_grad]
    trained_bytes = sum(p.numel() * p.element_size() for p in trainable)
    model_bytes = state_bytes(model.state_dict())
    assert trained_bytes < 0.1 * model_bytes
    opt = torch.optim.AdamW(trainable, lr=1e-3)
    sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=1.0, end_factor=0.1, total_iters=6)
    random.seed(4)
    np.random.seed(4)
    gen = torch.Generator().manual_seed(4)

    written: dict[str, dict[str, str]] = {}  # checkpoint name -> file -> sha256
    dir_mtime: dict[str, int] = {}
    live_after: dict[int, list[str]] = {}  # step -> checkpoint dirs in the live tree (= snapshot step-N)
    log_history: list = []
    with mounted(store_path, tmp_path / "mnt") as m:
        out = m / "out"
        out.mkdir()
        for n in range(1, 7):
            for _ in range(2):  # a couple of optimizer steps
                tokens = torch.randint(0, 8000, (4, 32), generator=gen)
                loss = model(tokens).logsumexp(-1).mean()
                loss.backward()
                opt.step()
                opt.zero_grad()
            sched.step()
            log_history.append({"step": n * 100, "loss": round(loss.item(), 6)})
            name = f"checkpoint-{n * 100}"
            t0 = time.time_ns()
            hf_save_checkpoint(out / name, model, opt, sched, n * 100, log_history)
            t1 = time.time_ns()
            ck = out / name
            assert sorted(os.listdir(ck)) == ["model.safetensors", "optimizer.pt", "rng_state.pth",
                                              "scheduler.pt", "trainer_state.json"]
            written[name] = {f: sha(ck / f) for f in os.listdir(ck)}
            mt = os.stat(ck).st_mtime_ns
            # the directory's mtime is that of its last new entry (trainer_state.json)
            assert t0 <= mt <= t1, (name, t0, mt, t1)
            dir_mtime[name] = mt
            removed = hf_rotate(out, KEEP)
            expect_removed = [f"checkpoint-{(n - KEEP) * 100}"] if n > KEEP else []
            assert removed == expect_removed, (n, removed, {k: v for k, v in dir_mtime.items()})
            live = sorted(os.listdir(out), key=lambda s: int(s.split("-")[1]))
            assert live == [f"checkpoint-{k * 100}" for k in range(max(1, n - KEEP + 1), n + 1)]
            for c in live:  # rotation removed nothing else and left the others' mtimes alone
                assert os.stat(out / c).st_mtime_ns == dir_mtime[c], c
            live_after[n] = live
            os.mkdir(m / ".snapshots" / f"step-{n}")

        assert sorted(os.listdir(m / ".snapshots")) == [f"step-{n}" for n in range(1, 7)]
        for n in range(1, 7):
            snap_out = m / ".snapshots" / f"step-{n}" / "out"
            assert sorted(os.listdir(snap_out), key=lambda s: int(s.split("-")[1])) == live_after[n]
            for c in live_after[n]:
                assert os.stat(snap_out / c).st_mtime_ns == dir_mtime[c], (n, c)
                assert sorted(os.listdir(snap_out / c)) == sorted(written[c])
                for f, digest in written[c].items():
                    assert sha(snap_out / c / f) == digest, (n, c, f)
        # a checkpoint rmtree'd from the live tree still loads from a snapshot
        old = m / ".snapshots" / "step-1" / "out" / "checkpoint-100"
        assert not (out / "checkpoint-100").exists()
        assert set(load_file(str(old / "model.safetensors"))) == set(model.state_dict())
        assert set(torch.load(old / "optimizer.pt", weights_only=True)["state"]) == {0, 1}
        release_mappings()

    with Store.open(store_path) as s:
        st = s.stats()
        assert st["snapshots"] == 6
        assert st["stored_bytes"] < 0.5 * st["logical_bytes"], st

        def model_added(n: int) -> int:
            gen_ = s.snapshot(f"step-{n}").gen
            ino = s.resolve(f"out/checkpoint-{n * 100}/model.safetensors", gen_).ino
            versions = s.history(ino)
            assert len(versions) == 1, versions
            return versions[0].added_bytes

        first, second = model_added(1), model_added(2)
        assert first > 0.9 * model_bytes, (first, model_bytes)
        # checkpoint-200's model shares the frozen backbone's chunks with checkpoint-100's
        assert 0.9 * trained_bytes <= second <= trained_bytes + 4 * MAX_CHUNK, (second, trained_bytes)
        for n in range(3, 7):
            assert model_added(n) <= trained_bytes + 4 * MAX_CHUNK, n


# -- 5. Lightning-like: save elsewhere, move in across filesystems, last.ckpt symlink -------------


def lightning_link(filepath: Path, linkpath: Path) -> None:
    """lightning.pytorch.callbacks.ModelCheckpoint._link_checkpoint."""
    if os.path.islink(linkpath) or os.path.isfile(linkpath):
        os.remove(linkpath)
    elif os.path.isdir(linkpath):
        shutil.rmtree(linkpath)
    os.symlink(os.path.relpath(filepath, os.path.dirname(linkpath)), linkpath)


def test_lightning_like_move_and_last_symlink(store_path, tmp_path):
    staging = tmp_path / "staging"  # on the test's own filesystem, not the mount
    staging.mkdir()
    model = make_model(5)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    saved = {}
    with mounted(store_path, tmp_path / "mnt") as m:
        assert os.stat(staging).st_dev != os.stat(m).st_dev
        ckdir = m / "lightning_logs" / "version_0" / "checkpoints"
        ckdir.mkdir(parents=True)
        for step in (100, 200, 300):
            with torch.no_grad():
                model.head.weight.mul_(0.5)
                model.head.bias.add_(step)
            ckpt = {"epoch": 0, "global_step": step, "pytorch-lightning_version": "2.5.0",
                    "state_dict": {k: v.clone() for k, v in model.state_dict().items()},
                    "optimizer_states": [opt.state_dict()], "lr_schedulers": []}
            name = f"epoch=0-step={step}.ckpt"
            src = staging / name
            torch.save(ckpt, src)
            src_mtime = os.stat(src).st_mtime_ns
            digest = sha(src)
            dst = shutil.move(src, ckdir / name)  # os.rename fails with EXDEV: copy2 + unlink
            assert Path(dst) == ckdir / name and not src.exists()
            assert sha(ckdir / name) == digest
            assert os.stat(ckdir / name).st_mtime_ns == src_mtime  # copy2 keeps the mtime
            lightning_link(ckdir / name, ckdir / "last.ckpt")
            saved[step] = ckpt
            assert os.readlink(ckdir / "last.ckpt") == name
        assert sorted(os.listdir(ckdir)) == sorted(["last.ckpt"] + [f"epoch=0-step={s}.ckpt" for s in (100, 200, 300)])
        assert os.path.islink(ckdir / "last.ckpt")
        got = torch.load(ckdir / "last.ckpt", weights_only=True)
        assert got["global_step"] == 300
        assert_state_equal(saved[300]["state_dict"], got["state_dict"])
        mapped = torch.load(ckdir / "last.ckpt", mmap=True, weights_only=True)
        assert_state_equal(saved[300]["state_dict"], mapped["state_dict"])
        del mapped
        for step in (100, 200):
            assert_state_equal(saved[step]["state_dict"],
                               torch.load(ckdir / f"epoch=0-step={step}.ckpt", weights_only=True)["state_dict"])
        release_mappings()


# -- 6. torch.distributed.checkpoint in one process -------------------------------------------------


def test_distributed_checkpoint_single_process(store_path, tmp_path):
    import torch.distributed.checkpoint as dcp

    model = make_model(6)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randint(0, 8000, (2, 16))).mean().backward()
    opt.step()
    state = {"model": {k: v.clone() for k, v in model.state_dict().items()},
             "optim": {f"{k}.{s}": v.clone() for k, st in opt.state_dict()["state"].items()
                       for s, v in st.items()},
             "extra": {"step": 7, "note": "hello"}}
    with mounted(store_path, tmp_path / "mnt") as m:
        ckdir = m / "dcp" / "step-7"
        ckdir.parent.mkdir()
        with warnings.catch_warnings():  # "torch.distributed is disabled ... assuming single process"
            warnings.simplefilter("ignore", UserWarning)
            dcp.save(state, checkpoint_id=str(ckdir))
            files = sorted(os.listdir(ckdir))
            assert ".metadata" in files and any(f.endswith(".distcp") for f in files), files
            assert not any(f.endswith(".tmp") for f in files), files
            target = {"model": {k: torch.zeros_like(v) for k, v in state["model"].items()},
                      "optim": {k: torch.zeros_like(v) for k, v in state["optim"].items()},
                      "extra": {"step": 0, "note": ""}}
            dcp.load(target, checkpoint_id=str(ckdir))
        assert_state_equal(state, target)


# -- 7. unchanged re-save stores nothing new -------------------------------------------------------


def test_unchanged_resave_adds_no_stored_bytes(store_path, tmp_path):
    model = make_model(7)
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    with mounted(store_path, tmp_path / "mnt") as m:
        (m / "ck").mkdir()
        torch.save(sd, m / "ck" / "model.pt")
        save_file(sd, str(m / "ck" / "model.safetensors"))
    with Store.open(store_path) as s:
        before = s.stats()
    with mounted(store_path, tmp_path / "mnt") as m:
        pt_size = os.path.getsize(m / "ck" / "model.pt")
        st_size = os.path.getsize(m / "ck" / "model.safetensors")
        torch.save(sd, m / "ck" / "model.pt")  # same path, O_TRUNC rewrite
        save_file(sd, str(m / "ck" / "model.safetensors"))
        (m / "ck2").mkdir()
        torch.save(sd, m / "ck2" / "model.pt")  # a new file with the same bytes
        assert sha(m / "ck" / "model.pt") == sha(m / "ck2" / "model.pt")
    with Store.open(store_path) as s:
        after = s.stats()
        assert after["stored_bytes"] == before["stored_bytes"], (before, after)
        assert after["chunks"] == before["chunks"]
        # torch.save rewrites the same inode (O_TRUNC); safetensors' save_file writes a temp file
        # and renames it over the name: a new inode, so ask for the history of the path
        for target in (s.resolve("ck/model.pt").ino, "ck/model.safetensors"):
            versions = s.history(target)
            assert len(versions) == 2 and versions[0].death_gen is None, (target, versions)
            assert versions[0].added_bytes == 0 and versions[1].added_bytes > 0, (target, versions)
        assert s.history(s.resolve("ck2/model.pt").ino)[0].added_bytes == 0
        assert after["logical_bytes"] >= before["logical_bytes"] + 2 * pt_size + st_size  # exact: see the next test


def test_unchanged_resave_counts_each_save_once_in_logical_bytes(store_path, tmp_path):
    """logical_bytes is what was saved: re-saving a checkpoint adds its size once, not twice
    (the kernel's mtime SETATTR before FLUSH makes a metadata-only version of the old body)."""
    sd = {k: v.contiguous() for k, v in make_model(8).state_dict().items()}
    with mounted(store_path, tmp_path / "mnt") as m:
        torch.save(sd, m / "model.pt")
        size = os.path.getsize(m / "model.pt")
    with Store.open(store_path) as s:
        assert s.stats()["logical_bytes"] == size
    with mounted(store_path, tmp_path / "mnt") as m:
        torch.save(sd, m / "model.pt")  # the same bytes again, O_TRUNC
    with Store.open(store_path) as s:
        st = s.stats()
        assert st["stored_bytes"] == size
        assert st["logical_bytes"] == 2 * size, st
