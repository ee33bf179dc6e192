"""A rank of the multi-process DCP tests (tests/mount/test_dcp_plugin.py), run by
`python -m tests.support.dcp_ranks RANK WORLD RENDEZVOUS MNT STEP MODE`: a gloo group on
loopback, a state dict with each rank's own tensors and one shared, saved with cowfs.dcp's
Writer (save, async_save) and with the stock FileSystemWriter, and loaded back with both
readers, compared bitwise. MODE "save" saves and loads; "load" loads
what "save" saved (STEP and STEP + 1); "die" saves, rank 1 killing itself midway through its file."""
from __future__ import annotations

import datetime
import os
import signal
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

import cowfs.dcp
from cowfs.plugins.dcp_storage import CowfsFileSystem, _PutStream


def state_for(rank: int, step: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    state = {f"rank{rank}.w{i}": torch.randn(256, 512, generator=g) for i in range(4)}
    state[f"rank{rank}.b"] = torch.randn(512, generator=g).to(torch.bfloat16)
    state["shared.step"] = torch.tensor(step)
    return state


def zeros_like(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: torch.zeros_like(v) for k, v in state.items()}


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a)


class _DyingStream(_PutStream):
    def write(self, data):  # type: ignore[no-untyped-def]
        n = super().write(data)
        if self.tell() > 1 << 20:
            os.kill(os.getpid(), signal.SIGKILL)  # a rank killed mid-save
        return n


class _DyingFileSystem(CowfsFileSystem):
    def create_stream(self, path, mode):  # type: ignore[no-untyped-def]
        if mode == "wb" and str(path).endswith(".distcp"):
            import contextlib

            @contextlib.contextmanager
            def dying():  # type: ignore[no-untyped-def]
                yield _DyingStream(path)
            return dying()
        return super().create_stream(path, mode)


def loads(path: Path, expect: dict[str, torch.Tensor], rank: int) -> bool:
    """Both readers load `expect` from `path` bitwise."""
    for reader in (cowfs.dcp.Reader(path), dcp.FileSystemReader(path)):
        got = zeros_like(expect)
        dcp.load(got, storage_reader=reader)
        if not same(got, expect):
            print(f"rank {rank}: {type(reader).__name__} of {path} differs", file=sys.stderr)
            return False
    return True


def main() -> int:
    rank, world, rendezvous, mnt, step, mode = (int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], Path(sys.argv[4]),
                                                int(sys.argv[5]), sys.argv[6])
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=10 if mode == "die" else 300))
    try:
        state = state_for(rank, step)
        ckpt = mnt / "dcp" / f"step-{step}"
        if mode == "die":
            writer = cowfs.dcp.Writer(ckpt)
            if rank == 1:
                writer.fs = _DyingFileSystem()
            dcp.save(state, storage_writer=writer)
            return 3  # rank 0 must not get here: its peer died before the metadata
        if mode == "load":  # what "save" saved: step and step + 1
            later = state_for(rank, step + 1)
            return 0 if loads(ckpt, state, rank) and loads(mnt / "dcp" / f"step-{step + 1}", later, rank) else 1
        dcp.save(state, storage_writer=cowfs.dcp.Writer(ckpt))
        dcp.save(state, storage_writer=dcp.FileSystemWriter(mnt / "dcp" / f"stock-{step}"))
        later = state_for(rank, step + 1)
        dcp.async_save(later, storage_writer=cowfs.dcp.Writer(mnt / "dcp" / f"step-{step + 1}",
                                                               thread_count=2)).result(timeout=300)
        return 0 if loads(ckpt, state, rank) and loads(mnt / "dcp" / f"step-{step + 1}", later, rank) else 1
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
