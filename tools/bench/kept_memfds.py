"""Memfds kept by the process against new ones (issue 34; cowfs/plugins/part_memfds.py), the
two ways alternating in one process:

    python -m tools.bench.kept_memfds [--mib 256] [--reps 8] [--dir /var/tmp]

* torch.save of MIB of fp32 tensors into new memfds, into memfds written before, and into a
  file on the disk (what a background save's stall is made of);
* a cold DCP load through `cowfs.dcp.Reader` (page cache dropped before each), its get into a
  memfd the daemon makes or into one of the process's kept ones, with the daemon's CPU.

Prints median [min-max] per arm. A bench tool: cowfs/ never imports it.
"""
from __future__ import annotations

import argparse
import io
import os
import shutil
import statistics
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Callable

from .mounting import cpu_seconds, drop_caches, init_store, mounted


class _FdWriter(io.RawIOBase):
    """Writes at increasing offsets of a descriptor (pwrite), as PutStream does."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self.fd, self.pos = fd, 0

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def write(self, data: Any) -> int:  # type: ignore[override]
        n = os.pwrite(self.fd, data, self.pos)
        self.pos += n
        return n


def _save_into(fd: int, state: Any) -> float:
    import torch

    t0 = time.perf_counter()
    buffered = io.BufferedWriter(_FdWriter(fd), 1 << 20)
    torch.save(state, buffered)
    buffered.flush()
    buffered.detach()
    return time.perf_counter() - t0


def _line(name: str, values: list[float]) -> str:
    return f"| {name} | {statistics.median(values):.3f} [{min(values):.3f}-{max(values):.3f}] |"


def print_table(title: str, prefix: str, where: Path, rows_of: Callable[[Path], list[str]]) -> None:
    """`rows_of` run in a new work directory under `where` (removed afterwards), its `_line`
    rows printed under `title` as a markdown table."""
    work = Path(tempfile.mkdtemp(prefix=prefix, dir=where))
    try:
        rows = rows_of(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{title}\n\n| measure | median [min-max] |\n| --- | --- |")
    print("\n".join(rows))


def saves(state: Any, work: Path, reps: int) -> list[str]:
    kept = os.memfd_create("kept")
    _save_into(kept, state)  # its pages made once
    times: dict[str, list[float]] = {"new memfd": [], "memfd written before": [], "file on the disk": []}
    for k in range(reps):
        arms: list[tuple[str, Callable[[], float]]] = [
            ("new memfd", lambda: _timed_new(state)),
            ("memfd written before", lambda: _save_into(kept, state)),
            ("file on the disk", lambda: _timed_file(state, work / "save.pt"))]
        for name, arm in arms[k % 3:] + arms[:k % 3]:
            os.sync()
            times[name].append(arm())
    os.close(kept)
    return [_line(f"torch.save into a {name}, s", v) for name, v in times.items()]


def _timed_new(state: Any) -> float:
    fd = os.memfd_create("new")
    try:
        return _save_into(fd, state)
    finally:
        os.close(fd)


def _timed_file(state: Any, path: Path) -> float:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        return _save_into(fd, state)
    finally:
        os.close(fd)


def dcp_loads(state: Any, work: Path, reps: int) -> list[str]:
    import torch
    import torch.distributed.checkpoint as dcp

    import cowfs.dcp
    import cowfs.plugins.dcp_storage as dcp_storage
    from cowfs.plugins.get import open_read

    store = init_store(work / "store")
    times: dict[bool, list[float]] = {False: [], True: []}
    cpu: dict[bool, list[float]] = {False: [], True: []}
    with mounted(store, work / "mnt") as m, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # dcp without a process group says so
        dcp.save(state, storage_writer=cowfs.dcp.Writer(work / "mnt" / "d"))
        try:
            for k in range(reps):
                for kept in ((False, True) if k % 2 == 0 else (True, False)):
                    dcp_storage.open_read = (  # type: ignore[misc]
                        lambda p, kept=False, ranges=None, _k=kept: open_read(p, kept=_k, ranges=ranges))
                    target = {key: torch.empty_like(v) for key, v in state.items()}
                    drop_caches()
                    c0, t0 = cpu_seconds(m.pid), time.perf_counter()
                    dcp.load(target, storage_reader=cowfs.dcp.Reader(work / "mnt" / "d"))
                    times[kept].append(time.perf_counter() - t0)
                    cpu[kept].append(cpu_seconds(m.pid) - c0)
                    assert all(torch.equal(target[key], state[key]) for key in state)
        finally:
            dcp_storage.open_read = open_read  # type: ignore[assignment]
    return [_line("cold dcp.load, get into a memfd the daemon makes, s", times[False]),
            _line("the same, daemon CPU s", cpu[False]),
            _line("cold dcp.load, get into a kept memfd, s", times[True]),
            _line("the same, daemon CPU s", cpu[True])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--reps", type=int, default=8)
    parser.add_argument("--dir", type=Path, default=Path("/var/tmp"))
    args = parser.parse_args()
    import torch

    state = {f"t{i}": torch.randn(args.mib << 14) for i in range(16)}  # 16 tensors, MIB in all
    print_table(f"{args.mib} MiB, {args.reps} reps per arm, alternating", "cowfs-bench-kept-", args.dir,
                lambda work: saves(state, work, args.reps) + dcp_loads(state, work, args.reps))


if __name__ == "__main__":
    main()
