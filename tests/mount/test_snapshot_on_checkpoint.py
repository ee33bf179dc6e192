"""`cowfs mount --snapshot-on checkpoint`: a snapshot per completed checkpoint, none for an
incomplete one, for each framework's save pattern (plain file writes in that pattern; the
real transformers Trainer is in test_trainer_history.py), and the CLI through the daemon."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import warnings
from pathlib import Path

import pytest
import torch

from cowfs.store import Store

from tests.support.mountutil import cowfs, kill9, mounted
from tests.support.storeutil import data

pytestmark = pytest.mark.mount
DEADLINE = 60.0  # seconds a condition may take


def wait_for(what: str, check, deadline: float = DEADLINE):
    end = time.monotonic() + deadline
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def snapshots(m: Path) -> set[str]:
    return set(os.listdir(m / ".snapshots"))


def wait_snapshots(m: Path, *names: str) -> None:
    wait_for(f"snapshots {names} (have {sorted(snapshots(m))})", lambda: set(names) <= snapshots(m))


def sha_tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()}


def hf_save(ckpt: Path, step: int, eval_loss: float, log: list[dict]) -> None:
    """Trainer._save_checkpoint's order: model, optimizer, scheduler, rng, trainer_state.json last."""
    ckpt.mkdir()
    (ckpt / "model.safetensors").write_bytes(data(300_000, step))
    (ckpt / "optimizer.pt").write_bytes(data(600_000, step + 1))
    (ckpt / "scheduler.pt").write_bytes(data(1000, step + 2))
    (ckpt / "rng_state.pth").write_bytes(data(2000, step + 3))
    log += [{"loss": eval_loss + 0.1, "step": step, "epoch": step / 100}, {"eval_loss": eval_loss, "step": step}]
    (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": step, "epoch": step / 100, "log_history": log}))


def rotate(run: Path, keep: int) -> None:
    for old in sorted(run.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))[:-keep]:
        shutil.rmtree(old)


def test_trainer_like_saves_get_a_snapshot_each_incomplete_none(store_path, tmp_path):
    written: dict[int, dict[str, str]] = {}
    log: list[dict] = []
    with mounted(store_path, tmp_path / "mnt", "--snapshot-on", "checkpoint") as m:
        run = m / "exp" / "run1"
        run.mkdir(parents=True)
        for step, loss in ((100, 0.8), (200, 0.3), (300, 0.5), (400, 0.6)):
            hf_save(run / f"checkpoint-{step}", step, loss, log)
            written[step] = sha_tree(run / f"checkpoint-{step}")
            rotate(run, 2)
        names = [f"exp:run1@step-{s}" for s in written]
        wait_snapshots(m, *names)
        for step in written:  # each snapshot: its checkpoint whole, as written, and every checkpoint it holds complete
            snap_run = m / ".snapshots" / f"exp:run1@step-{step}" / "exp" / "run1"
            assert sha_tree(snap_run / f"checkpoint-{step}") == written[step]
            for ck in snap_run.iterdir():
                assert (ck / "trainer_state.json").exists(), (step, ck.name)
        # an interrupted save: files written, trainer_state.json never
        (run / "checkpoint-500").mkdir()
        (run / "checkpoint-500" / "model.safetensors").write_bytes(data(300_000, 500))
        (run / "checkpoint-500" / "optimizer.pt").write_bytes(data(600_000, 501))
        # the same step saved again (a resume that re-did it) and then another run's save: snapshots
        # are taken in order, so once that one exists any for checkpoint-500 would too
        shutil.rmtree(run / "checkpoint-400")
        hf_save(run / "checkpoint-400", 400, 0.55, log)
        (m / "run2").mkdir()
        hf_save(m / "run2" / "checkpoint-1", 1, 1.0, [])
        wait_snapshots(m, "exp:run1@step-400.2", "run2@step-1")
        assert not {s for s in snapshots(m) if "step-500" in s}
        assert (m / ".snapshots" / "run2@step-1" / "exp" / "run1" / "checkpoint-500" / "optimizer.pt").exists()

        # the CLI through the daemon
        found = json.loads(cowfs("checkpoints", str(m), "/exp", "--json").stdout)
        assert [c["step"] for c in found] == [400, 400, 300, 200, 100]  # the re-save is a checkpoint of its own
        assert {c["step"]: c["live"] for c in found[2:]} == {300: True, 200: False, 100: False}
        best = json.loads(cowfs("prune", str(m), "--keep-best", "eval_loss", "1", "--keep-name", "run2*",
                                "--json").stdout)
        assert best["best"][0]["step"] == 200 and best["best"][0]["snapshot"] == "exp:run1@step-200"
        assert snapshots(m) == {"exp:run1@step-200", "run2@step-1"}
        out = cowfs("restore", str(m), "/exp/run1/checkpoint-200", "--snapshot", "exp:run1@step-200").stdout.decode()
        assert "5 files" in out
        assert sha_tree(run / "checkpoint-200") == written[200]  # the kernel sees the new directory at once
        # a restored checkpoint that a snapshot holds gets no second snapshot
        wait_for("the restore's trigger handled", lambda: "no checkpoint snapshot for /exp/run1/checkpoint-200: "
                 "snapshot exp:run1@step-200 holds it already" in (store_path / "cowfs.log").read_text())
        assert snapshots(m) == {"exp:run1@step-200", "run2@step-1"}
        listed = {s["name"]: s["checkpoint"] for s in json.loads(cowfs("snapshot", "list", str(m), "--json").stdout)}
        assert listed["exp:run1@step-200"]["step"] == 200 and listed["exp:run1@step-200"]["metrics"]["eval_loss"] == 0.3


def lightning_link(target: Path, link: Path) -> None:
    """ModelCheckpoint._link_checkpoint: last.ckpt replaced by a relative symlink."""
    if link.is_symlink() or link.exists():
        link.unlink()
    os.symlink(os.path.relpath(target, link.parent), link)


def test_lightning_like_checkpoints(store_path, tmp_path):
    staging = tmp_path / "staging"  # another file system: shutil.move copies, as Lightning's move does
    staging.mkdir()
    saved = {}
    with mounted(store_path, tmp_path / "mnt", "--snapshot-on", "checkpoint") as m:
        ckdir = m / "lightning_logs" / "version_0" / "checkpoints"
        ckdir.mkdir(parents=True)
        for step in (100, 200):
            src = staging / f"epoch=0-step={step}.ckpt"
            torch.save({"global_step": step, "state_dict": {"w": torch.full((5000,), float(step))}}, src)
            saved[step] = hashlib.sha256(src.read_bytes()).hexdigest()
            shutil.move(src, ckdir / src.name)
            lightning_link(ckdir / src.name, ckdir / "last.ckpt")
        (ckdir / "last.ckpt").unlink()  # save_last=True: last.ckpt is a second save, after the step-named one
        torch.save({"global_step": 200}, ckdir / "last.ckpt")
        only_last = m / "lightning_logs" / "version_1" / "checkpoints"  # save_top_k=0: only last.ckpt
        only_last.mkdir(parents=True)
        torch.save({"global_step": 7}, only_last / "last.ckpt")
        wait_snapshots(m, "lightning_logs:version_0@step-100", "lightning_logs:version_0@step-200",
                       "lightning_logs:version_1@last")
        # in order: version_0's last.ckpt was handled before version_1's, and got no snapshot
        assert snapshots(m) == {"lightning_logs:version_0@step-100", "lightning_logs:version_0@step-200",
                                "lightning_logs:version_1@last"}
        snap = m / ".snapshots" / "lightning_logs:version_0@step-200" / "lightning_logs" / "version_0" / "checkpoints"
        assert hashlib.sha256((snap / "epoch=0-step=200.ckpt").read_bytes()).hexdigest() == saved[200]
        # pinned at the .ckpt's commit: last.ckpt still pointed at the checkpoint before
        assert os.readlink(snap / "last.ckpt") == "epoch=0-step=100.ckpt"
        assert torch.load(snap / "last.ckpt", weights_only=True)["global_step"] == 100
        found = json.loads(cowfs("checkpoints", str(m), "--json").stdout)  # through the daemon
        v0 = "/lightning_logs/version_0/checkpoints"
        assert {(c["kind"], c["path"], c["step"]) for c in found} == {
            ("lightning", f"{v0}/epoch=0-step=100.ckpt", 100), ("lightning", f"{v0}/epoch=0-step=200.ckpt", 200),
            ("lightning", f"{v0}/last.ckpt", None), ("lightning", "/lightning_logs/version_1/checkpoints/last.ckpt", None)}
        assert {c["snapshot"] for c in found if c["step"] == 200} == {"lightning_logs:version_0@step-200"}


def test_dcp_save_gets_a_snapshot(store_path, tmp_path):
    import torch.distributed.checkpoint as dcp

    state = {"model": {"w": torch.randn(20_000), "b": torch.randn(100)}, "extra": {"step": 7}}
    with mounted(store_path, tmp_path / "mnt", "--snapshot-on", "checkpoint") as m:
        (m / "dcp").mkdir()
        with warnings.catch_warnings():  # "torch.distributed is disabled ... assuming single process"
            warnings.simplefilter("ignore", UserWarning)
            dcp.save(state, checkpoint_id=str(m / "dcp" / "step-7"))
            wait_snapshots(m, "dcp@step-7")
            snap = m / ".snapshots" / "dcp@step-7" / "dcp" / "step-7"
            assert sha_tree(snap) == sha_tree(m / "dcp" / "step-7") and ".metadata" in os.listdir(snap)
            target = {"model": {"w": torch.zeros(20_000), "b": torch.zeros(100)}, "extra": {"step": 0}}
            dcp.load(target, checkpoint_id=str(snap))
        assert torch.equal(target["model"]["w"], state["model"]["w"]) and target["extra"]["step"] == 7
        found = json.loads(cowfs("checkpoints", str(m), "--json").stdout)
        assert [(c["kind"], c["path"], c["step"], c["snapshot"]) for c in found] == [("dcp", "/dcp/step-7", 7, "dcp@step-7")]


def test_deepspeed_like_latest_waits_for_a_late_rank(store_path, tmp_path):
    with mounted(store_path, tmp_path / "mnt", "--snapshot-on", "checkpoint") as m:
        tag = m / "ds" / "global_step5"
        tag.mkdir(parents=True)
        (tag / "mp_rank_00_model_states.pt").write_bytes(data(200_000, 1))
        (tag / "zero_pp_rank_0_mp_rank_00_optim_states.pt").write_bytes(data(300_000, 2))
        rank1 = data(150_000, 3)
        with open(tag / "zero_pp_rank_1_mp_rank_00_optim_states.pt", "wb") as late:  # rank 1 is not done...
            late.write(rank1[:100_000])
            late.flush()
            (m / "ds" / "latest").write_text("global_step5")  # ...when rank 0 writes latest (DeepSpeed does)
            wait_for("the daemon to see the late rank", lambda: "checkpoint /ds/global_step5 still being written"
                     in (store_path / "cowfs.log").read_text())
            assert "ds@step-5" not in snapshots(m)
            late.write(rank1[100_000:])
        wait_snapshots(m, "ds@step-5")
        snap = m / ".snapshots" / "ds@step-5" / "ds" / "global_step5"
        assert (snap / "zero_pp_rank_1_mp_rank_00_optim_states.pt").read_bytes() == rank1
        assert sha_tree(snap) == sha_tree(tag)


def test_a_checkpoint_without_its_snapshot_gets_it_at_the_next_mount(store_path, tmp_path):
    mnt = tmp_path / "mnt"
    with mounted(store_path, mnt) as m:  # not watching: as if the daemon died between commit and snapshot
        (m / "run1").mkdir()
        hf_save(m / "run1" / "checkpoint-100", 100, 0.5, [])
        hf_save(m / "run1" / "checkpoint-200", 200, 0.4, [])
    with mounted(store_path, mnt, "--snapshot-on", "checkpoint") as m:
        hf_save(m / "run1" / "checkpoint-300", 300, 0.3, [])
        kill9(store_path, m)  # right after the commit: its snapshot taken or not
    with mounted(store_path, mnt, "--snapshot-on", "checkpoint") as m:
        wait_snapshots(m, "run1@step-100", "run1@step-200", "run1@step-300")
        gens = {s["name"]: s["generation"] for s in json.loads(cowfs("snapshot", "list", str(m), "--json").stdout)}
        assert len(gens) == 3
    with Store.open(store_path) as s:
        for step in (100, 200, 300):  # each pinned at its trainer_state.json's commit
            assert gens[f"run1@step-{step}"] == s.resolve(f"/run1/checkpoint-{step}/trainer_state.json").data_gen
        assert [n for n, _ in s.readdir(s.resolve("/run1").ino, gens["run1@step-100"])] == [b"checkpoint-100"]
