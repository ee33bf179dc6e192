"""The plug-ins' benchmark (issue 34): `make bench ARGS="--only plugins"`.

On the disk of the work directory, in the same run, alternating the arms in each rep:

Every timed arm starts after `sync` (no write-back of an earlier arm's pages beside it).

- stall: the seconds `cowfs.save(obj, path, background=True)` keeps the caller, against a
  plain torch.save into the page cache (no fsync) — target ≤ 1.1x;
- durable: the seconds from that return to the commit (the future done), against the
  save's size over the disk's fdatasync bandwidth (the same bytes written and fdatasync'ed
  into a plain file) — target ≤ 1.2x;
- load: cold (page cache dropped) `cowfs.load` (a get: the bytes in a memfd) and torch.load
  through the mount, against torch.load from the disk;
- DCP: dcp.save with cowfs.dcp.Writer and with FileSystemWriter through the mount, against
  FileSystemWriter on the disk; then dcp.load with each one's reader, cold.

Every rep saves new random tensors (nothing deduplicates). Returns a JSON-able dict;
`report` prints the table with each target met or not.
"""
from __future__ import annotations

import os
import statistics
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import torch

import cowfs
import cowfs.dcp

from .mounting import drop_caches, init_store, mounted

TENSOR_MIB = 16


def _state(mib: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    n = max(1, mib // TENSOR_MIB)
    return {f"layer{i}.weight": torch.randn(TENSOR_MIB << 18, generator=g) for i in range(n)}


def _timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _fdatasync_s(path: Path, data: bytes) -> float:
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fdatasync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - t0


def _rep(k: int, mnt: Path, plain: Path, mib: int, cold: bool) -> dict[str, float]:
    import torch.distributed.checkpoint as dcp

    state = _state(mib, 1000 + k)
    out: dict[str, float] = {}
    arms = ["plain", "cowfs"] if k % 2 == 0 else ["cowfs", "plain"]
    for arm in arms:
        os.sync()  # neither arm competes with the write-back of the other's dirty pages
        if arm == "plain":
            out["torch_save_page_cache_s"] = _timed(lambda: torch.save(state, plain / f"p{k}.pt"))
        else:
            t0 = time.perf_counter()
            future = cowfs.save(state, mnt / f"p{k}.pt", background=True)
            out["background_stall_s"] = time.perf_counter() - t0
            future.result()
            out["background_durable_s"] = time.perf_counter() - t0 - out["background_stall_s"]
    out["bytes"] = (plain / f"p{k}.pt").stat().st_size
    out["fdatasync_s"] = _fdatasync_s(plain / f"sync{k}.bin", (plain / f"p{k}.pt").read_bytes())
    os.unlink(plain / f"sync{k}.bin")

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # dcp without a process group says so
        writers = {"dcp_disk": lambda: dcp.FileSystemWriter(plain / f"d{k}"),
                   "dcp_mount": lambda: dcp.FileSystemWriter(mnt / f"fuse{k}"),
                   "dcp_cowfs": lambda: cowfs.dcp.Writer(mnt / f"d{k}")}
        readers = {"dcp_disk": lambda: dcp.FileSystemReader(plain / f"d{k}"),
                   "dcp_mount": lambda: dcp.FileSystemReader(mnt / f"fuse{k}"),
                   "dcp_cowfs": lambda: cowfs.dcp.Reader(mnt / f"d{k}")}
        names = list(writers)[k % 3:] + list(writers)[:k % 3]
        dcp_state = _state(mib, 2000 + k)
        for name in names:
            os.sync()
            out[f"{name}_save_s"] = _timed(lambda: dcp.save(dcp_state, storage_writer=writers[name]()))
        loads = {"torch_load_disk": lambda: torch.load(plain / f"p{k}.pt", weights_only=True),
                 "torch_load_mount": lambda: torch.load(mnt / f"p{k}.pt", weights_only=True),
                 "cowfs_load": lambda: cowfs.load(mnt / f"p{k}.pt", weights_only=True)}
        for name in list(loads)[k % 3:] + list(loads)[:k % 3]:
            drop_caches() if cold else None
            out[f"{name}_s"] = _timed(loads[name])
        for name in names:
            target = {key: torch.empty_like(v) for key, v in dcp_state.items()}
            drop_caches() if cold else None
            out[f"{name}_load_s"] = _timed(lambda: dcp.load(target, storage_reader=readers[name]()))
            assert all(torch.equal(target[key], dcp_state[key]) for key in dcp_state), name
    for p in plain.glob(f"p{k}.pt"):
        p.unlink()
    return out


def run_plugins(work: Path, mib: int, reps: int, log: Callable[[str], None]) -> dict[str, Any]:
    store, mnt, plain = work / "store", work / "mnt", work / "plain"
    plain.mkdir(parents=True)
    init_store(store)
    rows = []
    with mounted(store, mnt):
        cold = drop_caches()
        cowfs.save({"warm-up": torch.zeros(1)}, mnt / "warm-up.pt", background=True).result()  # imports, thread
        for k in range(reps):
            rows.append(_rep(k, mnt, plain, mib, cold))
            log(f"  plugins rep {k + 1}/{reps}: " + ", ".join(f"{n} {v:.2f}" for n, v in rows[-1].items() if n != "bytes"))
    return {"mib": mib, "reps": rows, "cold": cold}


TARGETS = (  # (what, numerator, denominator, most) - ratios of medians
    ("background save: stall / torch.save into the page cache", "background_stall_s", "torch_save_page_cache_s", 1.1),
    ("background save: durable after return / size over fdatasync bandwidth", "background_durable_s", "fdatasync_s", 1.2),
    ("cold load: cowfs.load / torch.load from the disk", "cowfs_load_s", "torch_load_disk_s", None),
    ("cold load: torch.load through the mount / from the disk", "torch_load_mount_s", "torch_load_disk_s", None),
    ("DCP save: cowfs.dcp.Writer / FileSystemWriter on the disk", "dcp_cowfs_save_s", "dcp_disk_save_s", None),
    ("DCP save: FileSystemWriter through the mount / on the disk", "dcp_mount_save_s", "dcp_disk_save_s", None),
    ("DCP load: cowfs.dcp.Reader / FileSystemReader on the disk", "dcp_cowfs_load_s", "dcp_disk_load_s", None),
    ("DCP load: FileSystemReader through the mount / on the disk", "dcp_mount_load_s", "dcp_disk_load_s", None),
)


def report(result: dict[str, Any]) -> str:
    rows = result["reps"]
    lines = [f"Plug-ins (issue 34): {result['mib']} MiB per save, {len(rows)} reps, cold reads: {result['cold']}",
             "| measure | cowfs s (each rep) | baseline s (each rep) | ratio of medians | target |",
             "| --- | --- | --- | --- | --- |"]
    for what, num, den, most in TARGETS:
        a, b = [r[num] for r in rows], [r[den] for r in rows]
        ratio = statistics.median(a) / statistics.median(b)
        verdict = "-" if most is None else (f"≤ {most}: {'met' if ratio <= most else 'not met'}")
        lines.append(f"| {what} | {' / '.join(f'{x:.2f}' for x in a)} | {' / '.join(f'{x:.2f}' for x in b)} "
                     f"| {ratio:.2f} | {verdict} |")
    return "\n".join(lines)
