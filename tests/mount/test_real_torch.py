"""PyTorch-side training libraries through a real mount, on the CPU, with tiny models made here
(no downloads, nothing reaches the network beyond loopback):

- Lightning: ModelCheckpoint(save_top_k=2, save_last="link") over four epochs (two checkpoints
  removed by Lightning, last.ckpt a relative symlink), then a new Trainer's fit(ckpt_path="last");
  the symlink resolves inside a snapshot and after a remount;
- torch.distributed.checkpoint under a one-rank gloo group: save, async_save (two writer threads,
  training goes on while it writes) and load of model + optimizer through Stateful;
- a DeepSpeed FastPersist writer's exact syscalls (open O_DIRECT without O_TRUNC, 1 MiB
  double-buffered blocks, the 4 KiB-aligned part of the last buffer with O_DIRECT, the rest
  appended through open('ab'), the reopen with O_DIRECT|O_APPEND and its fsync), O_DIRECT reads,
  and the `latest` tag file rewritten in place at each save, read back after a remount.
  (tests/mount/test_mount_semantics.py covers O_DIRECT blocks written out of order.)

Every loaded state is compared bitwise with the one that was saved; the store must fsck clean."""
from __future__ import annotations

import io
import mmap
import os
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn as nn

from cowfs.store import Store

from tests.support.frameworkutil import assert_same, framework_env, frozen, quiet_loggers, snapshot  # noqa: F401
from tests.support.mountutil import mounted

pytestmark = pytest.mark.mount

MiB = 1 << 20


# -- Lightning ----------------------------------------------------------------------------------

PL_EPOCHS = 4          # the first fit; four batches an epoch, a checkpoint at each epoch's end
PL_MORE_EPOCHS = 2     # the resumed fit adds these
PL_BATCHES = 4


def pl_name(epoch: int) -> str:
    return f"epoch={epoch}-step={(epoch + 1) * PL_BATCHES}.ckpt"


@pytest.mark.filterwarnings("ignore:Checkpoint directory .* exists and is not empty")  # the resumed fit's, by design
@pytest.mark.filterwarnings("ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated")  # lightning 2.6.6 on torch 2.13
def test_lightning_top2_last_link_then_fit_from_last(store_path, tmp_path, framework_env):
    pl = pytest.importorskip("lightning.pytorch")
    from lightning.pytorch.callbacks import ModelCheckpoint

    quiet_loggers()  # "GPU available: False", tips, "Restoring states from ..."

    features = torch.randn(PL_BATCHES * 8, 16, generator=torch.Generator().manual_seed(0))
    targets = features @ torch.randn(16, 1, generator=torch.Generator().manual_seed(1))

    class Regressor(pl.LightningModule):
        """An MLP with a BatchNorm (buffers, an int64 counter) that records what it saves and
        what it holds when training starts."""

        def __init__(self, seed: int) -> None:
            super().__init__()
            torch.manual_seed(seed)
            self.net = nn.Sequential(nn.Linear(16, 128), nn.BatchNorm1d(128), nn.Tanh(), nn.Linear(128, 1))  # ~10 KB
            self.saved: dict[int, dict[str, Any]] = {}
            self.at_start: dict[str, Any] = {}
            self.epoch_losses: list[float] = []

        def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
            x, y = batch
            loss = nn.functional.mse_loss(self.net(x), y)
            self.log("train_loss", loss, on_step=False, on_epoch=True)
            return loss

        def configure_optimizers(self) -> dict[str, Any]:
            opt = torch.optim.Adam(self.parameters(), lr=3e-3)
            return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9)}

        def on_train_epoch_end(self) -> None:
            self.epoch_losses.append(self.trainer.callback_metrics["train_loss"].item())

        def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
            self.saved[checkpoint["global_step"]] = frozen(
                {k: checkpoint[k] for k in ("global_step", "state_dict", "optimizer_states", "lr_schedulers")})

        def on_train_start(self) -> None:
            self.at_start = frozen({"global_step": self.trainer.global_step, "state_dict": self.state_dict(),
                                    "optimizer_states": [self.trainer.optimizers[0].state_dict()],
                                    "lr_schedulers": [self.trainer.lr_scheduler_configs[0].scheduler.state_dict()]})

    def loader() -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(features, targets), batch_size=8, num_workers=0)

    def trainer(root: Path, epochs: int, checkpoint: ModelCheckpoint | None) -> "pl.Trainer":
        return pl.Trainer(default_root_dir=str(root), max_epochs=epochs, accelerator="cpu", devices=1, logger=False,
                          enable_progress_bar=False, enable_model_summary=False,
                          enable_checkpointing=checkpoint is not None, callbacks=[checkpoint] if checkpoint else [])

    def top2_last(ckdir: Path) -> ModelCheckpoint:
        return ModelCheckpoint(dirpath=str(ckdir), filename="{epoch}-{step}", monitor="train_loss", mode="min",
                               save_top_k=2, save_last="link")

    def checkpoint_file(path: Path) -> dict[str, Any]:
        got = torch.load(path, weights_only=True)
        return {k: got[k] for k in ("global_step", "state_dict", "optimizer_states", "lr_schedulers")}

    reference = Regressor(0)  # uninterrupted, on the test's own disk, for the final weights
    trainer(tmp_path / "reference", PL_EPOCHS + PL_MORE_EPOCHS, None).fit(reference, loader())

    mnt = tmp_path / "mnt"
    with mounted(store_path, mnt) as m:
        ckdir = m / "lightning" / "checkpoints"
        first = Regressor(0)
        trainer(m / "lightning", PL_EPOCHS, top2_last(ckdir)).fit(first, loader())
        steps = [(e + 1) * PL_BATCHES for e in range(PL_EPOCHS)]
        assert sorted(first.saved) == steps  # four checkpoints written, last.ckpt a link (no fifth save)
        # the premise of the names below: the loss falls every epoch, so the top 2 are the last two
        assert first.epoch_losses == sorted(first.epoch_losses, reverse=True), first.epoch_losses
        assert sorted(os.listdir(ckdir)) == sorted([pl_name(PL_EPOCHS - 2), pl_name(PL_EPOCHS - 1), "last.ckpt"])
        assert os.path.islink(ckdir / "last.ckpt"), "save_last='link' made a copy: os.symlink failed on the mount"
        assert os.readlink(ckdir / "last.ckpt") == pl_name(PL_EPOCHS - 1)
        for epoch in (PL_EPOCHS - 2, PL_EPOCHS - 1):
            assert_same(first.saved[steps[epoch]], checkpoint_file(ckdir / pl_name(epoch)), pl_name(epoch))
        snap = snapshot(m, "lightning-first-fit") / "lightning" / "checkpoints"

        # a new process would do this: new Trainer, new module, fit(ckpt_path="last")
        resumed = Regressor(1)
        trainer(m / "lightning", PL_EPOCHS + PL_MORE_EPOCHS, top2_last(ckdir)).fit(resumed, loader(), ckpt_path="last")
        assert resumed.at_start["global_step"] == steps[-1]
        assert_same(first.saved[steps[-1]], resumed.at_start, "state when the resumed fit starts")
        last_epoch = PL_EPOCHS + PL_MORE_EPOCHS - 1
        assert resumed.trainer.global_step == (last_epoch + 1) * PL_BATCHES
        assert sorted(os.listdir(ckdir)) == sorted([pl_name(last_epoch - 1), pl_name(last_epoch), "last.ckpt"])
        assert os.readlink(ckdir / "last.ckpt") == pl_name(last_epoch)
        assert_same(reference.state_dict(), resumed.state_dict(), "resumed fit vs the uninterrupted one")

        # the snapshot's last.ckpt still names the first fit's newest checkpoint, and resolves to
        # the snapshot's copy of it
        assert os.readlink(snap / "last.ckpt") == pl_name(PL_EPOCHS - 1)
        assert_same(first.saved[steps[-1]], checkpoint_file(snap / "last.ckpt"), "snapshot's last.ckpt")
        final = resumed.saved[(last_epoch + 1) * PL_BATCHES]

    with mounted(store_path, mnt) as m:
        ckdir = m / "lightning" / "checkpoints"
        assert os.readlink(ckdir / "last.ckpt") == pl_name(last_epoch)
        assert_same(final, checkpoint_file(ckdir / "last.ckpt"), "last.ckpt after remount")


# -- torch.distributed.checkpoint -----------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:Detected an existing checkpoint in .*, overwriting")  # the overwrite is the point
def test_dcp_save_async_save_and_load_in_a_gloo_group(store_path, tmp_path, framework_env):
    import torch.distributed as dist

    if not dist.is_available():
        pytest.skip("torch built without torch.distributed")
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.checkpoint.stateful import Stateful

    class TrainState(Stateful):
        """Model + optimizer (through DCP's state_dict helpers) + step, as torchtitan keeps them."""

        def __init__(self, seed: int) -> None:
            torch.manual_seed(seed)
            self.model = nn.Sequential(nn.Embedding(512, 64), nn.Linear(64, 256), nn.GELU(), nn.LayerNorm(256),
                                       nn.Linear(256, 512))  # ~0.8 MB, ~2.4 MB with Adam's moments
            self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-3)
            self.step = 0

        def state_dict(self) -> dict[str, Any]:
            model_sd, optim_sd = get_state_dict(self.model, self.opt)
            return {"model": model_sd, "optim": optim_sd, "step": self.step}

        def load_state_dict(self, state: dict[str, Any]) -> None:
            set_state_dict(self.model, self.opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
            self.step = state["step"]

        def train_step(self) -> None:
            tokens = torch.randint(0, 512, (4, 16), generator=torch.Generator().manual_seed(self.step))
            logits = self.model(tokens)
            nn.functional.cross_entropy(logits.reshape(-1, 512), tokens.roll(-1, 1).reshape(-1)).backward()
            self.opt.step()
            self.opt.zero_grad()
            self.step += 1

    def loaded(path: Path) -> dict[str, Any]:
        fresh = TrainState(seed=99)  # other weights, optimizer state not yet made
        dcp.load({"train": fresh}, checkpoint_id=str(path))
        return frozen(fresh.state_dict())

    assert not dist.is_initialized()
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        mnt = tmp_path / "mnt"
        with mounted(store_path, mnt) as m:
            state = TrainState(seed=0)
            for _ in range(3):
                state.train_step()
            dcp.save({"train": state}, checkpoint_id=str(m / "dcp" / "step-3"))
            at_3 = frozen(state.state_dict())

            for _ in range(2):
                state.train_step()
            at_5 = frozen(state.state_dict())
            writer = dcp.FileSystemWriter(str(m / "dcp" / "step-5"), thread_count=2)
            pending = dcp.async_save({"train": state}, storage_writer=writer)
            assert isinstance(pending, Future)
            state.train_step()  # training goes on (in place) while the checkpoint is written
            pending.result(timeout=120)
            at_6 = frozen(state.state_dict())
            assert at_6["step"] == 6

            files = sorted(os.listdir(m / "dcp" / "step-5"))
            assert files == [".metadata", "__0_0.distcp", "__0_1.distcp"], files  # one file per writer thread
            assert_same(at_3, loaded(m / "dcp" / "step-3"), "dcp.save at step 3")
            assert_same(at_5, loaded(m / "dcp" / "step-5"), "dcp.async_save at step 5")

            # async_save over an existing checkpoint (overwrite=True): the new one replaces it
            dcp.async_save({"train": state}, checkpoint_id=str(m / "dcp" / "step-3")).result(timeout=120)
            assert_same(at_6, loaded(m / "dcp" / "step-3"), "async_save over step-3")
        with mounted(store_path, mnt) as m:
            assert_same(at_5, loaded(m / "dcp" / "step-5"), "step-5 after remount")
            assert_same(at_6, loaded(m / "dcp" / "step-3"), "step-3 after remount")
    finally:
        dist.destroy_process_group()


# -- a DeepSpeed FastPersist writer and its `latest` file --------------------------------------------

DS_BUFFER = MiB      # FastPersist's pinned I/O buffer, drained whole with O_DIRECT
DS_ALIGN = 4096      # the aio handle's alignment: the last buffer's aligned part still goes O_DIRECT


def fastpersist_write(path: Path, payload: bytes) -> None:
    """The syscalls deepspeed.io.FastFileWriter makes for one file (double buffer, one writer):
    open(O_DIRECT|O_CREAT|O_WRONLY) without O_TRUNC; each full buffer written at the next offset
    while the other one fills; at close the aligned part of the last buffer with O_DIRECT, the
    O_DIRECT fd closed, the unaligned rest appended through open('ab'), the file reopened
    O_DIRECT|O_WRONLY|O_APPEND, fsync'ed and closed."""
    fd = os.open(path, os.O_DIRECT | os.O_CREAT | os.O_WRONLY, 0o644)
    buffers = [mmap.mmap(-1, DS_BUFFER), mmap.mmap(-1, DS_BUFFER)]  # page-aligned, like pinned memory
    offset = 0
    try:
        with ThreadPoolExecutor(1) as aio:  # the drain of one buffer overlaps the fill of the other
            draining: Future | None = None
            for i, start in enumerate(range(0, len(payload) - DS_BUFFER + 1, DS_BUFFER)):
                buf = buffers[i % 2]
                buf[:] = payload[start:start + DS_BUFFER]
                if draining is not None:
                    assert draining.result() == DS_BUFFER
                draining = aio.submit(os.pwrite, fd, buf, start)
                offset = start + DS_BUFFER
            if draining is not None:
                assert draining.result() == DS_BUFFER
        rest = payload[offset:]
        aligned = len(rest) - len(rest) % DS_ALIGN
        if aligned:
            buffers[0][:aligned] = rest[:aligned]
            assert os.pwrite(fd, memoryview(buffers[0])[:aligned], offset) == aligned
    finally:
        os.close(fd)
        for b in buffers:
            b.close()
    with open(path, "ab") as f:
        f.write(rest[aligned:])
    fd = os.open(path, os.O_DIRECT | os.O_WRONLY | os.O_APPEND)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def odirect_read(path: Path) -> bytes:
    """The whole file through O_DIRECT reads of 1 MiB into an aligned buffer."""
    out = bytearray()
    buf = mmap.mmap(-1, DS_BUFFER)
    fd = os.open(path, os.O_DIRECT | os.O_RDONLY)
    try:
        while n := os.preadv(fd, [buf], len(out)):
            out += buf[:n]
    finally:
        os.close(fd)
        buf.close()
    return bytes(out)


def ds_checkpoint_bytes(state: dict[str, Any]) -> bytes:
    """torch.save bytes of `state`, padded (a string entry) so the file has full buffers, a
    4 KiB-aligned part in the last one and an unaligned tail: every path of the writer."""
    pad = 0
    while True:
        b = io.BytesIO()
        torch.save({**state, "pad": "x" * pad}, b)
        data = b.getvalue()
        if len(data) > 2 * DS_BUFFER and len(data) % DS_BUFFER >= DS_ALIGN and len(data) % DS_ALIGN:
            return data
        pad += 1000


DS_TAGS = ["global_step2", "global_step4", "final"]  # the last, shorter tag checks O_TRUNC of `latest`


def test_deepspeed_fastpersist_writer_and_latest_rewritten_in_place(store_path, tmp_path, framework_env):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256))  # ~2 MB
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    saved: dict[str, dict[str, bytes]] = {}
    mnt = tmp_path / "mnt"
    with mounted(store_path, mnt) as m:
        save_dir = m / "deepspeed"
        latest = save_dir / "latest"
        latest_ino = None
        for i, tag in enumerate(DS_TAGS):
            for _ in range(2):
                model(torch.randn(8, 256)).square().mean().backward()
                opt.step()
                opt.zero_grad()
            (save_dir / tag).mkdir(parents=True)
            files = {
                "mp_rank_00_model_states.pt": ds_checkpoint_bytes({"module": model.state_dict(), "global_steps": 2 * (i + 1)}),
                "zero_pp_rank_0_mp_rank_00_optim_states.pt": ds_checkpoint_bytes({"optimizer_state_dict": opt.state_dict()}),
            }
            for name, payload in files.items():
                fastpersist_write(save_dir / tag / name, payload)
            with open(latest, "w") as f:  # deepspeed's engine: the tag, rewritten in place each save
                f.write(tag)
            if latest_ino is None:
                latest_ino = os.stat(latest).st_ino
            assert os.stat(latest).st_ino == latest_ino, "latest was replaced, not rewritten"
            saved[tag] = files
            snapshot(m, f"ds-{i}")

        assert latest.read_text() == DS_TAGS[-1]
        for i, tag in enumerate(DS_TAGS):  # each snapshot holds the tag of its save
            assert (m / ".snapshots" / f"ds-{i}" / "deepspeed" / "latest").read_text() == tag
            for name, payload in saved[tag].items():
                assert (save_dir / tag / name).read_bytes() == payload, (tag, name)
                assert odirect_read(save_dir / tag / name) == payload, (tag, name, "O_DIRECT read")

    with mounted(store_path, mnt) as m:
        save_dir = m / "deepspeed"
        assert (save_dir / "latest").read_text() == DS_TAGS[-1]
        assert os.stat(save_dir / "latest").st_ino == latest_ino
        tag = (save_dir / "latest").read_text()
        for name, payload in saved[tag].items():
            assert odirect_read(save_dir / tag / name) == payload, (tag, name)
        got = torch.load(save_dir / tag / "mp_rank_00_model_states.pt", weights_only=True)
        assert got["global_steps"] == 2 * len(DS_TAGS)
        assert_same(model.state_dict(), got["module"], "module")
        got = torch.load(save_dir / tag / "zero_pp_rank_0_mp_rank_00_optim_states.pt", weights_only=True)
        assert_same(opt.state_dict(), got["optimizer_state_dict"], "optimizer")
        assert (m / ".snapshots" / "ds-0" / "deepspeed" / "latest").read_text() == DS_TAGS[0]

    with Store.open(store_path) as s:  # one file with a version per save, all held by the snapshots
        versions = s.history(s.resolve("deepspeed/latest").ino)
        assert len(versions) == len(DS_TAGS), versions
        assert [v.size for v in reversed(versions)] == [len(t) for t in DS_TAGS], versions
