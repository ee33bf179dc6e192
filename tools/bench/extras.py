"""Measurements outside the checkpoint series: snapshot creation with 10,000 files, and
the writeback cache on vs off for one big torch.save through the mount."""
from __future__ import annotations

import os
import shutil
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import torch

from tools.harnessutil import run_cowfs

from .mounting import drop_caches, init_store, mounted
from .savers import cowfs_torch
from .series import read_file


def snapshot_many_files(work: Path, files: int, reps: int, log: Callable[[str], None]) -> dict[str, Any]:
    """Create `files` 1 KiB files through the mount, then time snapshot creation three ways:
    mkdir in .snapshots (the engine operation as a client sees it), a request on the control
    socket from this process, and the `cowfs snapshot create` command (includes interpreter start)."""
    store = init_store(work / "store")
    out: dict[str, Any] = {"files": files}
    with mounted(store, work / "mnt") as m:
        per_dir = 100
        t0 = time.perf_counter()
        payload = os.urandom(1024)
        for i in range(files):
            d = m.mnt / f"d{i // per_dir:03d}"
            if i % per_dir == 0:
                d.mkdir()
            with open(d / f"f{i % per_dir:03d}.bin", "wb") as f:
                f.write(payload)
        out["create_files_s"] = time.perf_counter() - t0
        log(f"  created {files} files in {out['create_files_s']:.1f}s")
        mkdir_s, socket_s, cli_s = [], [], []
        for r in range(reps):
            t = time.perf_counter()
            os.mkdir(m.mnt / ".snapshots" / f"mkdir-{r}")
            mkdir_s.append(time.perf_counter() - t)
            t = time.perf_counter()
            m.call("snapshot_create", name=f"socket-{r}")
            socket_s.append(time.perf_counter() - t)
            t = time.perf_counter()
            run_cowfs("snapshot", "create", str(m.mnt), f"cli-{r}")  # a new interpreter each time, timed with it
            cli_s.append(time.perf_counter() - t)
        out.update(mkdir_s=mkdir_s, socket_s=socket_s, cli_s=cli_s, stats=m.stats())
        t = time.perf_counter()
        sorted(os.listdir(m.mnt / ".snapshots" / "mkdir-0" / f"d{(files - 1) // per_dir // 2:03d}"))
        out["list_snapshot_dir_s"] = time.perf_counter() - t
    return out


def synthetic_state_dict(nbytes: int) -> dict[str, torch.Tensor]:
    """fp32 tensors of 4 MiB each, random values (no two chunks alike), `nbytes` in all."""
    g = torch.Generator().manual_seed(1)
    per = 1 << 20  # elements
    return {f"t{i}": torch.randn(per, generator=g) for i in range(max(1, nbytes // (4 * per)))}


def writeback_compare(work: Path, nbytes: int, reps: int, log: Callable[[str], None]) -> dict[str, Any]:
    """torch.save + fsync of `nbytes` of fresh random tensors into a new store, writeback cache
    on and off alternately; then a cold sequential read of the file."""
    sd = synthetic_state_dict(nbytes)
    runs: list[dict[str, Any]] = []
    for r in range(reps):
        for wb in (True, False):
            d = work / f"wb-{int(wb)}-{r}"
            store = init_store(d / "store")
            with mounted(store, d / "mnt", writeback=wb) as m:
                cpu0 = m.cpu()
                res = cowfs_torch(sd, m.mnt / "model.pt", probe=m.spilled)
                cpu = m.cpu() - cpu0
                drop_caches()
                read_s = read_file(m.mnt / "model.pt")
            shutil.rmtree(d)
            runs.append({"writeback": wb, "bytes": res.bytes, "save_s": res.seconds, "durable_s": res.durable_seconds, "spilled": res.spilled,
                         "daemon_cpu_s": cpu, "cold_read_s": read_s})
            log(f"  writeback {'on ' if wb else 'off'}: save {res.bytes / res.seconds / 1e6:.0f} MB/s "
                f"(fsync + close {res.durable_seconds:.2f}s, {(res.spilled or 0) / 2**20:.0f} MiB out of order), "
                f"cold read {res.bytes / read_s / 1e6:.0f} MB/s, daemon CPU {cpu:.2f}s")
    summary = {}
    for wb in (True, False):
        rs = [x for x in runs if x["writeback"] is wb]
        summary["on" if wb else "off"] = {
            "save_MBps": statistics.median(x["bytes"] / x["save_s"] / 1e6 for x in rs),
            "cold_read_MBps": statistics.median(x["bytes"] / x["cold_read_s"] / 1e6 for x in rs),
            "daemon_cpu_s_per_GiB": statistics.median(x["daemon_cpu_s"] / (x["bytes"] / 2**30) for x in rs),
            "durable_s": statistics.median(x["durable_s"] for x in rs),
            "spilled_MiB": statistics.median((x["spilled"] or 0) / 2**20 for x in rs),
        }
    return {"bytes": nbytes, "runs": runs, "median": summary}
