"""`cowfs compact` on a mounted store, through the daemon: HF-style checkpoints written by
torch and safetensors read back byte-exact before and after, also through a descriptor
opened before the rewrite, and after a remount."""
from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from tests.support.mountutil import mounted
from tools.harnessutil import run_cowfs, sha_file


def write_checkpoints(mnt: Path, n: int) -> dict[Path, tuple[str, int]]:
    g = torch.Generator().manual_seed(0)
    w = {f"h.{i}.w": torch.randn(384, 1024, generator=g) * 0.02 for i in range(3)}
    w["wte"] = torch.randn(1000, 256, generator=g).to(torch.bfloat16)
    out = {}
    for i in range(n):
        w = {k: (v.float() - 1e-4 * torch.randn(v.shape, generator=g)).to(v.dtype) for k, v in w.items()}
        ckpt = mnt / f"checkpoint-{(i + 1) * 20}"
        ckpt.mkdir()
        save_file(w, ckpt / "model.safetensors")
        torch.save({"state": {k: {"exp_avg": v * 0.1} for k, v in w.items()}, "step": i}, ckpt / "optimizer.pt")
        (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": (i + 1) * 20}))
        for f in ckpt.iterdir():
            out[f] = sha_file(f)
    return out


def test_compact_through_the_daemon(store_path: Path, tmp_path: Path) -> None:
    mnt = tmp_path / "mnt"
    with mounted(store_path, mnt):
        shas = write_checkpoints(mnt, 5)
        held = mnt / "checkpoint-40" / "model.safetensors"
        with open(held, "rb") as f:  # opened before the rewrite, read after it and gc
            r = run_cowfs("compact", str(mnt), "--json")
            report = json.loads(r.stdout)
            assert report["recut"] == 10 and report["deltas"] > 0, report
            # what it replaced is given back by the compaction itself (the open file's records kept);
            # every piece was stored by the save already (tensor files are pieced as they are
            # written), so its raw record is replaced by an encoded one of the same chunk
            assert report["gc_bytes_freed"] > 0 and report["rewritten"] > 0, report
            assert report["stored_bytes"] < report["stored_bytes_before"], report
            run_cowfs("gc", str(mnt))
            assert hashlib.sha256(f.read()).hexdigest() == shas[held][0]
        for path, sha in shas.items():
            assert sha_file(path) == sha, path
        stats = json.loads(run_cowfs("stats", str(mnt), "--json").stdout)
        assert stats["uncompacted_bodies"] == 0 and stats["codecs"]["fdelta"]["chunks"] > 0
        assert stats["stored_bytes"] < stats["unique_bytes"]
        again = json.loads(run_cowfs("compact", str(mnt), "--json").stdout)
        assert again["bodies"] == 0
    with mounted(store_path, mnt):  # cold: nothing from the kernel's page cache
        for path, sha in shas.items():
            assert sha_file(path) == sha, path
        sd = load_file(mnt / "checkpoint-20" / "model.safetensors")
        assert sd["wte"].dtype == torch.bfloat16
        opt = torch.load(mnt / "checkpoint-100" / "optimizer.pt", weights_only=True)
        assert opt["step"] == 4
    r = run_cowfs("fsck", str(store_path), "--json")
    assert json.loads(r.stdout)["clean"]


def test_daemon_compacts_by_itself_when_idle(store_path: Path, tmp_path: Path) -> None:
    mnt = tmp_path / "mnt"
    with mounted(store_path, mnt, "--compact-idle", "1s"):
        shas = write_checkpoints(mnt, 3)
        deadline = time.monotonic() + 120  # generous: the machine may be busy
        while True:
            stats = json.loads(run_cowfs("stats", str(mnt), "--json").stdout)
            if stats["uncompacted_bodies"] == 0:
                break
            assert time.monotonic() < deadline, f"not compacted within 120 s: {stats}"
            time.sleep(0.2)
        assert stats["codecs"]["fdelta"]["chunks"] > 0
        for path, sha in shas.items():
            assert sha_file(path) == sha, path
        assert "compacted" in (store_path / "cowfs.log").read_text()


def test_a_store_set_to_read_through_one_record_stores_no_deltas(store_path: Path, tmp_path: Path) -> None:
    run_cowfs("config", str(store_path), "--read-chain", "1")
    mnt = tmp_path / "mnt"
    with mounted(store_path, mnt):
        shown = json.loads(run_cowfs("config", str(mnt), "--json").stdout)  # the mountpoint names its store
        assert shown["read_chain"] == 1 and shown["store"] == str(store_path.absolute())
        for target in (mnt, store_path):  # the daemon holds the store: no change while mounted
            r = run_cowfs("config", str(target), "--read-chain", "2", check=False)
            assert r.returncode == 2 and r.stderr.count("\n") == 1 and "unmount it" in r.stderr, r.stderr
        shas = write_checkpoints(mnt, 4)
        report = json.loads(run_cowfs("compact", str(mnt), "--json").stdout)
        assert report["recut"] == 8 and report["deltas"] == 0, report
        codecs = json.loads(run_cowfs("stats", str(mnt), "--json").stdout)["codecs"]
        assert not {"sub", "xor", "fdelta", "fdelta4"} & set(codecs) and codecs["grouped"]["chunks"] > 0, codecs
        for path, sha in shas.items():
            assert sha_file(path) == sha, path
    assert json.loads(run_cowfs("config", str(store_path), "--json").stdout)["read_chain"] == 1
