"""`python -m tools.bench.write_requests`: what a mount's FUSE thread spends per GiB written,
arm against arm (issue 33: the trio thread is the serial part of every write).

    python -m tools.bench.write_requests [--gib 1] [--files 2000] [--reps 4] [--work DIR]
                                         [--code [DIR:...]TREE ...]

Four writers, each into a new store per arm and repetition, mounted by that arm's cowfs
(`--code TREE`: another source tree, a worktree of another commit with its extension built
in place; the first arm is this tree; `--code DIR:TREE` puts DIR before TREE on PYTHONPATH,
for instance another pyfuse3 build installed there with `pip install --target DIR`):
`dd bs=4M conv=fsync` and `cp` (4 MiB writes: st_blksize) of --gib GiB of random bytes,
then fsync; a torch.save of float32 tensors of about --gib GiB into an open file, flushed
and fsynced; and --files files of 4 KiB written by 8 threads (open, write, close: the
data-path benchmark's small files, where the kernel queues requests). The arms alternate,
their order reversed every other repetition. Printed per workload and arm (median
[min-max]): MB/s (files/s for small files), the daemon's trio thread (which serves every FUSE
request) and the whole daemon in CPU seconds per GiB written (ms per file), and the trio
thread's CPU against the first arm's in the same repetition.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from tools.harnessutil import run_cowfs

from .docs import REPO
from .mounting import cpu_seconds, thread_cpu_seconds, unmount

WORKLOADS = ("dd", "cp", "torch.save", "small files")
TORCH_SAVE = """import os, sys, torch
torch.manual_seed(int(sys.argv[3]))
n = max(1, round(float(sys.argv[2]) * 16))  # tensors of 64 MiB
sd = {f"w{i}": torch.randn(1024, 16384) for i in range(n)}
with open(sys.argv[1], "wb") as f:
    torch.save(sd, f)
    f.flush()
    os.fsync(f.fileno())
"""


def write(workload: str, src: Path, dest: Path, gib: float, rep: int, files: int) -> int:
    """Write `dest` in the mount as `workload` does; the bytes written (files for small files)."""
    if workload == "small files":
        from .datapath import SMALL_WRITERS, small_files  # noqa: PLC0415 - datapath imports torch; this tool runs it in subprocesses

        small_files(dest, files, SMALL_WRITERS)
        return files
    if workload == "dd":
        subprocess.run(["dd", f"if={src}", f"of={dest}", "bs=4M", "conv=fsync", "status=none"], check=True)
    elif workload == "cp":
        subprocess.run(["cp", str(src), str(dest)], check=True)
        fd = os.open(dest, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    else:
        subprocess.run([sys.executable, "-c", TORCH_SAVE, str(dest), str(gib), str(rep)], check=True)
    return dest.stat().st_size


Arm = tuple[Path, tuple[Path, ...]]  # a source tree, and the directories before it on PYTHONPATH


def parse_arm(value: str) -> Arm:
    *before, tree = value.split(":")
    return Path(tree).resolve(), tuple(Path(b).resolve() for b in before)


def run_arm(arm: Arm, workload: str, src: Path, work: Path, gib: float, rep: int,
            files: int) -> tuple[float, float, float]:
    """One write into a new store mounted by the arm's cowfs: (MB/s, trio thread CPU s per GiB,
    daemon CPU s per GiB); for small files (files/s, trio thread and daemon CPU ms per file)."""
    code, before = arm
    store, mnt = work / "store", work / "mnt"
    shutil.rmtree(store, ignore_errors=True)
    mnt.mkdir(parents=True, exist_ok=True)
    run_cowfs("init", str(store), code=code, before=before)
    run_cowfs("mount", str(store), str(mnt), "--compact-idle", "off", code=code, before=before)
    pid = int((store / "lock").read_text())
    try:
        trio0, cpu0 = thread_cpu_seconds(pid)[pid][1], cpu_seconds(pid)
        t0 = time.monotonic()
        n = write(workload, src, mnt / "f", gib, rep, files)
        wall = time.monotonic() - t0
        trio, cpu = thread_cpu_seconds(pid)[pid][1] - trio0, cpu_seconds(pid) - cpu0
    finally:
        unmount(mnt, pid)
        shutil.rmtree(store, ignore_errors=True)
    if workload == "small files":
        return n / wall, trio / n * 1e3, cpu / n * 1e3
    return n / wall / 1e6, trio / (n / 2**30), cpu / (n / 2**30)


def spread(xs: list[float], fmt: str = "{:.2f}") -> str:
    return f"{fmt.format(statistics.median(xs))} [{fmt.format(min(xs))}-{fmt.format(max(xs))}]"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.bench.write_requests", description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=1.0, help="GiB per write")
    ap.add_argument("--reps", type=int, default=4, help="repetitions (each runs every arm once per workload)")
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/cowfs-write-requests"),
                    help="where the stores and the source file go (default: on the disk, in /var/tmp)")
    ap.add_argument("--files", type=int, default=2000, help="files of 4 KiB in the small-files workload")
    ap.add_argument("--code", action="append", default=[], metavar="[DIR:...]TREE",
                    help="another source tree to compare, after DIRs on PYTHONPATH (another pyfuse3 build)")
    args = ap.parse_args(argv)
    if args.reps < 1 or args.gib <= 0 or args.files < 1:
        ap.error("--reps and --files must be 1 or more and --gib above 0")
    arms: list[Arm] = [(REPO, ()), *(parse_arm(c) for c in args.code)]
    for code, before in arms[1:]:
        if not (code / "cowfs").is_dir():
            ap.error(f"--code {code}: no cowfs/ there")
        for b in before:
            if not b.is_dir():
                ap.error(f"--code: {b} is not a directory")
    args.work.mkdir(parents=True, exist_ok=True)
    src = args.work / "src.bin"
    with open(src, "wb") as f:
        for _ in range(round(args.gib * 256)):
            f.write(os.urandom(4 << 20))
    res: dict[tuple[str, int], list[tuple[float, float, float]]] = {(w, a): [] for w in WORKLOADS for a in range(len(arms))}
    try:
        for rep in range(args.reps):
            for workload in WORKLOADS:
                order = list(range(len(arms)))
                for a in order if rep % 2 == 0 else order[::-1]:
                    res[(workload, a)].append(run_arm(arms[a], workload, src, args.work / f"arm{a}", args.gib, rep,
                                                      args.files))
    finally:
        src.unlink(missing_ok=True)
    print(f"WRITE requests through the mount: {args.gib} GiB per write, {args.files} small files, {args.reps} reps, "
          f"arms alternating; {os.cpu_count()} CPUs; the store in {args.work}\n")
    print("| workload | arm | MB/s (files/s) | trio thread CPU s/GiB (ms/file) | daemon CPU s/GiB (ms/file) | "
          "trio thread / the first arm's |")
    print("| --- | --- | --- | --- | --- | --- |")
    for workload in WORKLOADS:
        first = res[(workload, 0)]
        for a, (code, before) in enumerate(arms):
            runs = res[(workload, a)]
            ratio = [r[1] / f[1] for r, f in zip(runs, first)]
            name = "this tree" if a == 0 else ":".join(map(str, [*before, code]))
            print(f"| {workload} | {name} | {spread([r[0] for r in runs], '{:.0f}')} | "
                  f"{spread([r[1] for r in runs])} | {spread([r[2] for r in runs])} | {spread(ratio)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
