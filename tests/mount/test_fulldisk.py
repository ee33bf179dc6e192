"""Full device (issue 5): the store lives on a small tmpfs that fills up.

Segments are preallocated (posix_fallocate when a segment is created), so on a
full device the store's ENOSPC comes from creating the next segment, from the
SQLite catalog's WAL, and from the spill files of non-sequential writes. The
writer must see ENOSPC (at write, fsync or close), the file it was writing must
keep its previous version, every committed version must stay intact, the daemon
must keep serving, and freeing space (snapshot delete + gc) must make writing
work again.
"""
from __future__ import annotations

import errno
import io
import json
import os
from pathlib import Path

import pytest
import safetensors.torch
import torch

from cowfs.errors import NoSpace
from cowfs.store import ROOT_INO, Store

from tests.support.mountutil import cowfs, daemon_pid, mounted, small_fs
from tests.support.storeutil import assert_clean, data, fill, free_bytes

pytestmark = pytest.mark.mount

SEGMENT = 4 << 20


# -- the engine on a full device -------------------------------------------------------


def test_commit_failing_with_enospc_can_be_retried_after_space_is_freed(tmp_path):
    with small_fs(tmp_path / "dev", "24m") as dev:
        path = dev / "store"
        Store.init(path, segment_size=SEGMENT)
        with Store.open(path) as s:
            s.write_file("/a", data(3_000_000, 1))  # the head segment is 3/4 full
            f = s.create(ROOT_INO, b"b")
            filler = fill(dev)
            with s.open_session(f.ino) as w:
                w.write(0, data(6_000_000, 2))  # one batch, chunked at commit: needs a new segment
                with pytest.raises(NoSpace) as e:
                    w.commit()
                assert e.value.errno == errno.ENOSPC
                assert s.read_file("/b") == b""  # still its previous (empty) version
                with pytest.raises(NoSpace):
                    w.commit()  # still full: fails again, changes nothing
                filler.unlink()
                w.commit()
            assert s.read_file("/b") == data(6_000_000, 2)
            assert s.read_file("/a") == data(3_000_000, 1)
        assert_clean(path)


def test_background_batch_failing_with_enospc_loses_no_bytes(tmp_path):
    """A streaming batch that cannot be stored makes the next write that needs room for a
    batch fail without taking that write's bytes (or, when the batch after it was already in
    flight and no later write needs room, the read that waits for them); once space is back,
    the same call goes through."""
    with small_fs(tmp_path / "dev", "32m") as dev:
        path = dev / "store"
        Store.init(path, segment_size=SEGMENT)
        body = data(20 << 20, 3)
        step = 1 << 20
        with Store.open(path) as s:
            s.write_file("/a", data(3_000_000, 1))
            f = s.create(ROOT_INO, b"big")
            filler = fill(dev)
            with s.open_session(f.ino) as w:
                failures = 0

                def retried(call):  # type: ignore[no-untyped-def]
                    nonlocal failures
                    while True:
                        try:
                            return call()
                        except NoSpace:
                            failures += 1
                            filler.unlink(missing_ok=True)  # make room, then the same call again

                for pos in range(0, len(body), step):
                    retried(lambda: w.write(pos, body[pos:pos + step]))
                assert retried(lambda: w.read(0, len(body))) == body
                assert failures == 1
                w.commit()
            assert s.read_file("/big") == body
        assert_clean(path)


def test_catalog_enospc_is_a_clean_nospace_and_leaves_the_catalog_intact(tmp_path):
    with small_fs(tmp_path / "dev", "16m") as dev:
        path = dev / "store"
        Store.init(path, segment_size=SEGMENT)
        with Store.open(path) as s:
            s.write_file("/a", data(1_000_000, 1))
            filler = fill(dev)
            made = 0
            with pytest.raises(NoSpace) as e:
                for i in range(100_000):
                    s.mkdir(ROOT_INO, b"directory-%06d-" % i + b"x" * 200)
                    made += 1
            assert e.value.errno == errno.ENOSPC
            assert len(s.readdir(ROOT_INO)) == made + 1
            assert s.read_file("/a") == data(1_000_000, 1)
            filler.unlink()
            s.mkdir(ROOT_INO, b"after")
            assert len(s.readdir(ROOT_INO)) == made + 2
        assert_clean(path)


# -- through the mount ------------------------------------------------------------------

KINDS = ("pt", "safetensors", "pt")
NAMES = ("model.pt", "model.safetensors", "optimizer.pt")


def tensors(step: int) -> dict[str, torch.Tensor]:
    """A checkpoint of ~1.5 MB whose size differs from step to step."""
    g = torch.Generator().manual_seed(step)
    n = 350_000 + step * 7919 % 100_000
    return {"weight": torch.randn(n, generator=g), "bias": torch.randn(257, generator=g)}


def serialized(kind: str, sd: dict[str, torch.Tensor]) -> bytes:
    if kind == "pt":
        buf = io.BytesIO()
        torch.save(sd, buf)
        return buf.getvalue()
    return safetensors.torch.save(sd)


def save(path: Path, kind: str, sd: dict[str, torch.Tensor]) -> None:
    """Save as a training loop would, then fsync and close, so the writer sees any error."""
    with open(path, "wb") as f:
        if kind == "pt":
            torch.save(sd, f)
        else:
            f.write(safetensors.torch.save(sd))
        f.flush()
        os.fsync(f.fileno())


def assert_loads(path: Path, kind: str, want: bytes) -> None:
    """Byte-identical to what was saved, and loadable by its framework."""
    got = path.read_bytes()
    assert got == want, f"{path}: {len(got)} bytes, expected {len(want)}"
    loaded = torch.load(path, weights_only=True) if kind == "pt" else safetensors.torch.load_file(str(path))
    ref = torch.load(io.BytesIO(want), weights_only=True) if kind == "pt" else safetensors.torch.load(want)
    assert loaded.keys() == ref.keys() and all(torch.equal(loaded[k], ref[k]) for k in ref)


def kind_of(name: str) -> str:
    return "safetensors" if name.endswith(".safetensors") else "pt"


def assert_everything_intact(m: Path, live: dict[str, bytes], snaps: dict[str, dict[str, bytes]]) -> None:
    for name, want in live.items():
        assert_loads(m / "run" / name, kind_of(name), want)
    for snap, files in snaps.items():
        for name, want in files.items():
            assert (m / ".snapshots" / snap / "run" / name).read_bytes() == want, f"{snap}/{name}"


def test_full_device_keeps_every_committed_checkpoint_and_recovers_after_gc(tmp_path):
    with small_fs(tmp_path / "dev", "64m") as dev:
        store = dev / "store"
        cowfs("init", str(store), "--segment-size", "4M")
        live: dict[str, bytes] = {}
        snaps: dict[str, dict[str, bytes]] = {}
        with mounted(store, tmp_path / "mnt") as m:
            (m / "run").mkdir()
            failed: tuple[str, OSError] | None = None
            for step in range(200):  # ~1.6 MB per checkpoint: the 64 MiB device fills long before
                name = NAMES[step % 3]
                sd = tensors(step)
                try:
                    save(m / "run" / name, kind_of(name), sd)
                except OSError as e:
                    failed = (name, e)
                    break
                live[name] = serialized(kind_of(name), sd)
                if step % 3 == 2:
                    snap = f"step-{step}"
                    (m / ".snapshots" / snap).mkdir()
                    snaps[snap] = dict(live)
            assert failed is not None, "the device never filled up"
            name, err = failed
            assert err.errno == errno.ENOSPC, err
            assert step > 6 and len(snaps) >= 2
            # the file being written reads as its previous version, right after the failed close
            assert os.stat(m / "run" / name).st_size == len(live[name])
            assert_everything_intact(m, live, snaps)
            pid = daemon_pid(store)
            os.kill(pid, 0)  # still alive, and serving
            assert sorted(os.listdir(m / "run")) == sorted(live)

            # still full: a second attempt fails the same way and changes nothing
            with pytest.raises(OSError) as e:
                save(m / "run" / name, kind_of(name), tensors(1000))
            assert e.value.errno == errno.ENOSPC
            # a writer that ignores close() errors (safetensors' save_file) never leaves a torn
            # file: the target reads as its previous version or the new one
            target = m / "run" / "model.safetensors"
            sd = tensors(1001)
            try:
                safetensors.torch.save_file(sd, str(target))
            except Exception as e:  # noqa: BLE001 - safetensors reports I/O errors as SafetensorError
                assert "os error 28" in str(e), e
            assert target.read_bytes() in (live["model.safetensors"], safetensors.torch.save(sd))
            if target.read_bytes() != live["model.safetensors"]:
                live["model.safetensors"] = target.read_bytes()
            assert_everything_intact(m, live, snaps)

            # make room: delete the old snapshots and one file; the history they held goes
            # with prune (gc alone keeps every retained version), which then runs gc
            keep = sorted(snaps, key=lambda s: int(s.split("-")[1]))[-1]
            cowfs("snapshot", "delete", str(m), *[s for s in snaps if s != keep])
            snaps = {keep: snaps[keep]}
            (m / "run" / "optimizer.pt").unlink()
            del live["optimizer.pt"]
            before = free_bytes(dev)
            cowfs("prune", str(m), "--keep-last", "1")
            cowfs("gc", str(m))
            # room for the four checkpoints below, with margin (a 4 MiB segment holds three 1 MiB
            # tensor pieces of model.safetensors: records never span segments, so more of each
            # segment stays unused, and fewer checkpoints fit and come back, than with content-
            # defined chunks alone)
            assert free_bytes(dev) > before + 4 * SEGMENT
            for step in range(2000, 2004):  # writing works again
                name = NAMES[step % 3]
                save(m / "run" / name, kind_of(name), tensors(step))
                live[name] = serialized(kind_of(name), tensors(step))
            assert_everything_intact(m, live, snaps)
            assert os.kill(pid, 0) is None and daemon_pid(store) == pid
        r = cowfs("fsck", str(store), check=False)
        assert r.returncode == 0, r.stdout.decode() + r.stderr.decode()
        with mounted(store, tmp_path / "mnt") as m:  # and all of it survives an unmount
            assert_everything_intact(m, live, snaps)
        assert_clean(store)


def test_failed_write_of_an_in_place_change_commits_nothing(tmp_path):
    """A WRITE that fails (no room for the spill file of a non-sequential write) is dropped by
    the kernel, which reports it at close without a FLUSH: the daemon must not commit the
    rest of the session at RELEASE, or the file would keep half of the change."""
    with small_fs(tmp_path / "dev", "48m") as dev:
        store = dev / "store"
        cowfs("init", str(store), "--segment-size", "4M")
        old = data(3 << 20, 1)
        with mounted(store, tmp_path / "mnt") as m:
            (m / "ckpt.bin").write_bytes(old)
            (m / "small").write_bytes(b"s" * 100_000)  # the head segment keeps room for a commit
            for i in range(300):  # and the catalog's WAL has grown to where it is recycled
                (m / f"d{i}").mkdir()
                (m / f"d{i}").rmdir()
            filler = fill(dev)
            with pytest.raises(OSError) as e:
                with open(m / "ckpt.bin", "r+b") as f:
                    f.write(b"A" * 65536)  # offset 0: kept in memory by the session
                    f.seek(2 << 20)
                    f.write(b"B" * 65536)  # not sequential: needs the spill file
            assert e.value.errno == errno.ENOSPC
            assert (m / "ckpt.bin").read_bytes() == old
            filler.unlink()
            assert (m / "ckpt.bin").read_bytes() == old
            versions = len(json.loads(cowfs("log", str(m), "/ckpt.bin", "--json").stdout))
            assert versions == 1  # the failed change left no version behind
            with open(m / "ckpt.bin", "r+b") as f:  # with room again, the same change goes through
                f.write(b"A" * 65536)
                f.seek(2 << 20)
                f.write(b"B" * 65536)
            new = b"A" * 65536 + old[65536:2 << 20] + b"B" * 65536 + old[(2 << 20) + 65536:]
            assert (m / "ckpt.bin").read_bytes() == new
        with Store.open(store) as s:
            assert s.read_file("/ckpt.bin") == new
            assert len(s.history("/ckpt.bin")) == versions + 1
        assert_clean(store)


def test_catalog_full_through_the_mount_is_enospc_and_corrupts_nothing(tmp_path):
    with small_fs(tmp_path / "dev", "16m") as dev:
        store = dev / "store"
        cowfs("init", str(store), "--segment-size", "4M")
        model = serialized("pt", tensors(1))
        with mounted(store, tmp_path / "mnt") as m:
            save(m / "model.pt", "pt", tensors(1))
            filler = fill(dev)
            made = []
            with pytest.raises(OSError) as e:  # every change is a catalog transaction: its WAL fills
                for i in range(100_000):
                    (m / (f"dir-{i:06d}-" + "x" * 200)).mkdir()
                    made.append(f"dir-{i:06d}-" + "x" * 200)
            assert e.value.errno == errno.ENOSPC
            for op in (lambda: save(m / "model.pt", "pt", tensors(2)),
                       lambda: os.rename(m / "model.pt", m / "renamed.pt"),
                       lambda: (m / ".snapshots" / "full").mkdir()):
                with pytest.raises(OSError) as e:
                    op()
                assert e.value.errno == errno.ENOSPC
            assert_loads(m / "model.pt", "pt", model)
            assert sorted(os.listdir(m)) == sorted(made + ["model.pt"])
            filler.unlink()
            save(m / "model.pt", "pt", tensors(3))
            os.rename(m / "model.pt", m / "renamed.pt")
            (m / ".snapshots" / "after").mkdir()
            assert_loads(m / "renamed.pt", "pt", serialized("pt", tensors(3)))
        r = cowfs("fsck", str(store), check=False)
        assert r.returncode == 0, r.stdout.decode() + r.stderr.decode()
        with Store.open(store) as s:
            assert s.read_file("/renamed.pt", gen=s.snapshot("after").gen) == serialized("pt", tensors(3))
            # the save that failed left no version (the kernel's mtime update after the rename may add a
            # metadata-only one)
            assert {v.size for v in s.history("/model.pt")} == {len(serialized("pt", tensors(3))), len(model)}


def test_the_catalog_reserve_lets_a_full_store_give_space_back(tmp_path):
    """Changes that free space may use the catalog's reserve; others get ENOSPC and leave it."""
    with small_fs(tmp_path / "dev", "16m") as dev:
        path = dev / "store"
        Store.init(path, segment_size=SEGMENT)
        reserve = path / "catalog.db.reserve"
        with Store.open(path) as s:
            assert reserve.stat().st_blocks * 512 >= 1 << 20
            for i in range(3):
                s.write_file("/a", data(1_000_000, i))
                s.snapshot_create(f"s{i}")
            filler = fill(dev)
            with pytest.raises(NoSpace):
                for i in range(100_000):
                    s.mkdir(ROOT_INO, b"directory-%06d-" % i + b"x" * 200)
            assert reserve.exists()  # a change that frees nothing never takes it
            s.snapshot_delete("s0")
            s.snapshot_delete("s1")
            s.expire_history(0)
            s.gc()
            assert s.read_file("/a") == data(1_000_000, 2)
            filler.unlink()
            s.gc()
            assert reserve.stat().st_blocks * 512 >= 1 << 20  # allocated again once there is room
        assert_clean(path)
