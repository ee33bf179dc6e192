"""The data path against the plain disk (issue 15): saves, raw writes, cold reads and small
files, in interleaved pairs, with the daemon's CPU per thread.

One store and one plain directory in the same work directory (so the same filesystem); one
mount (default options) for the whole part. Every workload runs `reps` pairs, cowfs and the
plain disk in an order that alternates per pair:

* save-torch: torch.save of `size` bytes of new random fp32 tensors (a new seed per pair) +
  fsync + close in the mount, against the safe pattern on the disk (temp file, fsync,
  rename, fsync of the directory);
* save-safetensors: safetensors save_file + fsync of the file and of its directory, both;
* write-dd: `dd if=SRC of=DST bs=4M conv=fsync` (SRC: `size` new random bytes, in the page
  cache); write-cp: `cp SRC DST`, then fsync of DST (another SRC);
* read-cat, read-torch, read-safetensors, read-safe-open: the files the last pair wrote,
  read with the page cache dropped before each read: `cat` (128 KiB reads) of the dd file,
  torch.load (weights_only) of the torch file, load_file and safe_open + get_tensor of
  every tensor of the safetensors file;
* small-files: `small` files of 4 KiB, each open(O_CREAT) + write + close, by SMALL_WRITERS
  threads at once (no fsync on either side; every close through cowfs is durable).

For every cowfs operation the daemon's CPU seconds come from /proc: its main thread (the
trio thread, which answers FUSE), and everything else (whole process minus it: worker
threads, including those that ended).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from .mounting import CLK_TCK, cpu_seconds, drop_caches, init_store, mounted
from .savers import durable_safetensors, fsync_path, safe_torch

Log = Callable[[str], None]
GIB = 1 << 30
SMALL_FILE = 4096
SMALL_WRITERS = 8  # threads writing small files at once
WRITES = ("save-torch", "save-safetensors", "write-dd", "write-cp")
READS = ("read-cat", "read-torch", "read-safetensors", "read-safe-open")


def thread_cpu(pid: int) -> float:
    """utime + stime of the process's main thread (for the daemon: the trio thread)."""
    with open(f"/proc/{pid}/task/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def state_dict(nbytes: int, seed: int) -> dict[str, torch.Tensor]:
    """fp32 tensors of 16 MiB, random (a new seed: new content, nothing to deduplicate)."""
    g = torch.Generator().manual_seed(seed)
    per = 4 << 20  # elements
    return {f"layer{i}.weight": torch.randn(per, generator=g) for i in range(max(1, nbytes // (4 * per)))}


def _random_file(path: Path, size: int) -> Path:
    """`size` new random bytes (left in the page cache: reading them costs both sides alike)."""
    with open(path, "wb") as f:
        for _ in range(max(1, size >> 22)):
            f.write(os.urandom(4 << 20))
    return path


def _cowfs_torch(obj: Any, path: Path) -> None:
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


def _cowfs_safetensors(obj: dict[str, torch.Tensor], path: Path) -> None:
    save_file(obj, str(path))
    fsync_path(path)


def _dd(src: Path, dst: Path) -> None:
    subprocess.run(["dd", f"if={src}", f"of={dst}", "bs=4M", "conv=fsync", "status=none"], check=True)


def _cp(src: Path, dst: Path) -> None:
    subprocess.run(["cp", str(src), str(dst)], check=True)
    fsync_path(dst)


def _cat(path: Path) -> None:
    subprocess.run(["cat", str(path)], check=True, stdout=subprocess.DEVNULL)


def _safe_open_all(path: Path) -> None:
    with safe_open(str(path), framework="pt") as f:
        for k in f.keys():
            f.get_tensor(k)


def small_files(d: Path, n: int, writers: int, prefix: str = "f") -> None:
    """n files of 4 KiB, by `writers` threads at once (as DCP's ranks or a data loader's
    workers write them), each file created, written and closed; named PREFIX + number."""
    d.mkdir(parents=True, exist_ok=True)
    payload = os.urandom(SMALL_FILE)

    def write(first: int) -> None:
        for i in range(first, n, writers):
            fd = os.open(d / f"{prefix}{i:06d}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, payload)
            finally:
                os.close(fd)

    with ThreadPoolExecutor(max_workers=writers) as pool:
        list(pool.map(write, range(writers)))


class _Pairs:
    """The timings of one workload: seconds per side, bytes, and the daemon's CPU per cowfs run."""

    def __init__(self) -> None:
        self.cowfs: list[float] = []
        self.disk: list[float] = []
        self.trio_cpu: list[float] = []
        self.daemon_cpu: list[float] = []
        self.bytes = 0

    def as_dict(self) -> dict[str, Any]:
        return {"cowfs_s": self.cowfs, "disk_s": self.disk, "trio_cpu_s": self.trio_cpu,
                "daemon_cpu_s": self.daemon_cpu, "bytes": self.bytes}


def run_datapath(work: Path, size: int, small: int, reps: int, log: Log, writeback: str = "default") -> dict[str, Any]:
    """Every workload of the module doc, `reps` interleaved pairs each; the mount's writeback
    cache as `cowfs mount` sets it ("default"), or "on" or "off"."""
    store, mnt, disk = work / "store", work / "mnt", work / "disk"
    disk.mkdir(parents=True)
    init_store(store)
    res: dict[str, _Pairs] = {name: _Pairs() for name in (*WRITES, *READS, "small-files")}
    with mounted(store, mnt, writeback=None if writeback == "default" else writeback == "on") as m:
        (mnt / "d").mkdir()

        def timed(name: str, on_cowfs: bool, fn: Callable[[], None], nbytes: int) -> None:
            cpu0, trio0 = cpu_seconds(m.pid), thread_cpu(m.pid)
            t0 = time.perf_counter()
            fn()
            dt = time.perf_counter() - t0
            p = res[name]
            p.bytes = nbytes
            if on_cowfs:
                p.cowfs.append(dt)
                p.trio_cpu.append(thread_cpu(m.pid) - trio0)
                p.daemon_cpu.append(cpu_seconds(m.pid) - cpu0)
            else:
                p.disk.append(dt)

        for rep in range(reps):
            sides = [(True, mnt / "d"), (False, disk)]
            if rep % 2:
                sides.reverse()
            # new content for every workload of every pair: nothing deduplicates against an earlier one
            sd, flat = state_dict(size, 100 + rep), state_dict(size, 10_000 + rep)
            nbytes = sum(t.numel() * t.element_size() for t in sd.values())
            src_dd, src_cp = _random_file(work / "dd.src", size), _random_file(work / "cp.src", size)
            for on_cowfs, d in sides:
                pt, st, dd, cp = d / "model.pt", d / "model.safetensors", d / "dd.bin", d / "cp.bin"
                timed("save-torch", on_cowfs, (lambda: _cowfs_torch(sd, pt)) if on_cowfs else (lambda: safe_torch(sd, pt)),
                      nbytes)
                timed("save-safetensors", on_cowfs, (lambda: _cowfs_safetensors(flat, st)) if on_cowfs else
                      (lambda: durable_safetensors(flat, st)), nbytes)
                timed("write-dd", on_cowfs, lambda: _dd(src_dd, dd), size)
                timed("write-cp", on_cowfs, lambda: _cp(src_cp, cp), size)
            for on_cowfs, d in sides:
                for name, fn in (("read-cat", lambda: _cat(d / "dd.bin")),
                                 ("read-torch", lambda: torch.load(d / "model.pt", map_location="cpu", weights_only=True)),
                                 ("read-safetensors", lambda: load_file(str(d / "model.safetensors"))),
                                 ("read-safe-open", lambda: _safe_open_all(d / "model.safetensors"))):
                    drop_caches()
                    timed(name, on_cowfs, fn, size if name == "read-cat" else nbytes)
            for on_cowfs, d in sides:
                sub = d / f"small-{rep}"
                timed("small-files", on_cowfs, lambda: small_files(sub, small, SMALL_WRITERS), small * SMALL_FILE)
                shutil.rmtree(sub)
            log(f"  datapath pair {rep + 1}/{reps}: " + ", ".join(
                f"{name} {p.cowfs[-1] / p.disk[-1]:.2f}x" for name, p in res.items() if p.cowfs and p.disk))
    return {"size": size, "small_files": small, "small_writers": SMALL_WRITERS, "reps": reps, "cpus": os.cpu_count(),
            "writeback": writeback,
            "workloads": {name: p.as_dict() for name, p in res.items()}}
