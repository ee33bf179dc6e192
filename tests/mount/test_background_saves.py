"""cowfs.save(..., background=True) and cowfs.lightning.CheckpointIO (issue 34): the caller
waits for the copy into memory only; the commits follow in order, with a memory bound; a
failed or interrupted background save loses that save only; Lightning saves, prunes and
resumes through the plug-in bitwise like an uninterrupted run."""
from __future__ import annotations

import errno
import gc
import os
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn as nn

import cowfs
from cowfs.plugins.background import BackgroundPuts
from cowfs.plugins.put import PutStream, put
from cowfs.store import Store
from tests.support.frameworkutil import assert_same, framework_env, quiet_loggers  # noqa: F401
from tests.support.mountutil import cowfs as cowfs_cli
from tests.support.mountutil import daemon_pid, kill9, mounted

pytestmark = pytest.mark.mount


def test_background_saves_commit_in_order(store_path: Path, tmp_path: Path) -> None:
    with mounted(store_path, tmp_path / "m") as mnt:
        w = torch.randn(512, 512)
        future = cowfs.save({"w": w}, mnt / "a.pt", background=True)
        saved = w.clone()
        w.add_(1.0)  # changed after the call returned: not in the save
        assert future.result(timeout=120) is True
        assert torch.equal(cowfs.load(mnt / "a.pt", weights_only=True)["w"], saved)
        futures = [cowfs.save({"step": i, "w": w * i}, mnt / "b.pt", background=True) for i in range(5)]
        cowfs.wait_for_saves()
        assert all(f.done() and f.result() for f in futures)
        assert cowfs.load(mnt / "b.pt", weights_only=True)["step"] == 4
        # a background save the kernel refuses at its open fails at the call, and leaves nothing
        cowfs_cli("snapshot", "create", str(mnt), "s1")
        with pytest.raises(OSError) as e:
            cowfs.save({"x": 1}, mnt / ".snapshots" / "s1" / "new.pt", background=True)
        assert e.value.errno == errno.EROFS
        with pytest.raises(FileNotFoundError):
            cowfs.save({"x": 1}, mnt / "no-such-dir" / "x.pt", background=True)
        cowfs.wait_for_saves()  # nothing failed after its call returned
    with Store.open(store_path) as s:
        versions = s.history(s.resolve("/b.pt").ino)
        assert len(versions) == 5, versions


@pytest.mark.parametrize("cpus, overlapped", [(2, False), (16, True)])
def test_a_background_save_overlaps_its_parts_only_with_cpus_to_spare(store_path: Path, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch,
                                                                      cpus: int, overlapped: bool) -> None:
    """With fewer than OVERLAP_CPUS the daemon's work would take the caller's CPU: the parts go
    once the copy is done; with more, each part goes as it fills."""
    import cowfs.plugins.background as background

    monkeypatch.setattr(background, "_cpus", lambda: cpus)
    monkeypatch.setattr("cowfs.plugins.put.PART_BYTES", 1 << 20)
    copied = [False]
    sent: list[tuple[bool, bool]] = []  # (more, the copy was done)
    real = PutStream._ship

    def counted(self: PutStream, part: Any, more: bool) -> None:
        sent.append((more, copied[0]))
        real(self, part, more)

    def fill(f: Any) -> None:
        f.write(blob)
        f.flush()
        copied[0] = True

    monkeypatch.setattr(PutStream, "_ship", counted)
    blob = os.urandom((4 << 20) + 5)
    with mounted(store_path, tmp_path / "m") as mnt:
        assert BackgroundPuts().submit(mnt / "f.bin", fill).result(timeout=120) is True
        assert [more for more, _ in sent] == [True] * 4 + [False] and (mnt / "f.bin").read_bytes() == blob
        assert any(not done for _, done in sent) is overlapped, sent


def test_background_saves_wait_for_memory(store_path: Path, tmp_path: Path) -> None:
    with mounted(store_path, tmp_path / "m") as mnt:
        puts = BackgroundPuts(limit=1)  # any save in flight fills the bound
        first = puts.submit(mnt / "1.bin", lambda f: f.write(os.urandom(8 << 20)))
        second = puts.submit(mnt / "2.bin", lambda f: f.write(b"two"))
        assert first.done() and first.result() is True  # the second waited for it before copying
        assert second.result(timeout=60) is True
        assert (mnt / "2.bin").read_bytes() == b"two"


def test_daemon_killed_during_a_background_save(store_path: Path, tmp_path: Path) -> None:
    old, new = os.urandom(1 << 20), os.urandom(48 << 20)
    mnt = tmp_path / "m"
    with mounted(store_path, mnt):
        put(mnt / "f", lambda f: f.write(old))
        puts = BackgroundPuts()
        future = puts.submit(mnt / "f", lambda f: f.write(new))
        kill9(store_path, mnt)
        try:
            committed = future.result(timeout=120)
        except OSError:
            committed = False
    with mounted(store_path, mnt):
        got = (mnt / "f").read_bytes()
        assert got == new if committed else got in (old, new), (len(got), committed)


def test_daemon_killed_between_the_parts_of_a_put(store_path: Path, tmp_path: Path) -> None:
    """The daemon holds no descriptor of its own mount's files while a put waits for parts
    (one it held would hang its exit: the FLUSH of that close waits for the daemon itself)."""
    mnt = tmp_path / "m"
    with mounted(store_path, mnt):
        put(mnt / "f", lambda f: f.write(b"before"))
        stream = PutStream(mnt / "f", part_bytes=1 << 20)
        stream.write(os.urandom(3 << 20))  # three parts in the daemon, the last not sent
        pid = daemon_pid(store_path)
        kill9(store_path, mnt)
        deadline = time.monotonic() + 60
        while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:  # reaped: every thread exited
            time.sleep(0.05)
        assert not os.path.exists(f"/proc/{pid}"), "the killed daemon hangs in its exit"
        with pytest.raises(OSError):
            stream.finish()
    with mounted(store_path, mnt):
        assert (mnt / "f").read_bytes() == b"before"


def test_a_put_whose_daemon_died_closes_its_file_once(store_path: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The close of the file of a put whose daemon was killed fails (ENOTCONN), yet Linux has
    released the descriptor: closing it again later (abort, close, the object collected) would
    close whatever file got that number since. It happened in a background save's thread, and
    a test after it lost a pipe or its SQLite journal."""
    mnt = tmp_path / "m"
    closes: list[int] = []
    with mounted(store_path, mnt):
        stream = PutStream(mnt / "f", part_bytes=1 << 20)
        stream.write(os.urandom(2 << 20))  # parts sent: the file is open
        file_fd = stream._fd
        assert file_fd >= 0
        kill9(store_path, mnt)
        real_close = os.close

        def recording(fd: int) -> None:
            closes.append(fd)
            real_close(fd)

        monkeypatch.setattr(os, "close", recording)
        with pytest.raises(OSError):
            stream.finish()
        stream.close()
        del stream
        gc.collect()
        monkeypatch.undo()
    assert closes.count(file_fd) == 1, closes


@pytest.mark.filterwarnings("ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated")  # lightning 2.6.6 on torch 2.13
@pytest.mark.filterwarnings("ignore:Checkpoint directory .* exists and is not empty")  # the resumed fit's, by design
def test_lightning_checkpoint_io_saves_prunes_and_resumes(store_path: Path, tmp_path: Path, framework_env: None) -> None:
    pl = pytest.importorskip("lightning.pytorch")
    from lightning.pytorch.callbacks import ModelCheckpoint

    import cowfs.lightning

    quiet_loggers()
    x = torch.randn(32, 8, generator=torch.Generator().manual_seed(0))
    y = x @ torch.randn(8, 1, generator=torch.Generator().manual_seed(1))

    class Model(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = nn.Sequential(nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 1))

        def training_step(self, batch: Any, _i: int) -> torch.Tensor:
            return nn.functional.mse_loss(self.net(batch[0]), batch[1])

        def configure_optimizers(self) -> Any:
            return torch.optim.Adam(self.parameters(), lr=1e-2)

    def fit(root: Path, epochs: int, plugin: Any, ckpt_path: str | None = None) -> Model:
        model = Model()
        callbacks = [ModelCheckpoint(dirpath=str(root / "ck"), filename="{epoch}", save_top_k=2,
                                     monitor="step", mode="max")] if plugin else []
        trainer = pl.Trainer(default_root_dir=str(root), max_epochs=epochs, accelerator="cpu", devices=1, logger=False,
                             enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks,
                             enable_checkpointing=bool(plugin), plugins=[plugin] if plugin else None)
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)
        trainer.fit(model, loader, ckpt_path=ckpt_path)
        return model

    reference = fit(tmp_path / "ref", 5, None)
    with mounted(store_path, tmp_path / "m") as mnt:
        fit(mnt / "run", 3, cowfs.lightning.CheckpointIO(background=True))
        assert sorted(os.listdir(mnt / "run" / "ck")) == ["epoch=1.ckpt", "epoch=2.ckpt"]  # epoch 0 pruned
        stock = torch.load(mnt / "run" / "ck" / "epoch=2.ckpt", weights_only=True)  # a plain torch.load reads it
        assert stock["epoch"] == 2
        resumed = fit(mnt / "run", 5, cowfs.lightning.CheckpointIO(), str(mnt / "run" / "ck" / "epoch=2.ckpt"))
        assert_same(reference.state_dict(), resumed.state_dict(), "resumed through the CheckpointIO")
