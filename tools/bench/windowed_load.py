"""A cold DCP load of a one-file checkpoint larger than a get's window (issue 34's gets in
windows), two ways alternating in one process, then one of a checkpoint in several files:

    python -m tools.bench.windowed_load [--mib 2560] [--window-mib 1024] [--files 4]
        [--files-mib 1024] [--reps 5] [--dir /var/tmp]

* `cowfs.dcp.Reader` getting the file a window at a time (`get.WINDOW` = --window-mib), the
  next window got while DCP copies items out of this one, three windows held at most;
* `cowfs.dcp.Reader` getting the whole file in one memfd, as before windows (`WINDOW` past
  the file's size).

Then a checkpoint of FILES-MIB saved by one rank's FILES writer threads (a .distcp file
each), loaded in one process with the next file got while one is read (`GET_AHEAD`) and
with each file got when it is opened.

The checkpoints: fp32 tensors of 64 MiB each, saved with `cowfs.dcp.Writer`. Prints the
seconds and the daemon's CPU seconds, median [min-max], and checks every load. A bench tool:
cowfs/ never imports it.
"""
from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path
from typing import Any, Callable

from .kept_memfds import _line, print_table
from .mounting import cpu_seconds, drop_caches, init_store, mounted

ARMS = ("windows", "whole file")
TENSOR_MIB = 64


def state_of(mib: int, tensor_mib: int = TENSOR_MIB) -> dict[str, Any]:
    import torch

    return {f"t{i}": torch.randn(tensor_mib << 18) for i in range(max(1, mib // tensor_mib))}


def _cold_loads(state: dict[str, Any], work: Path, reps: int, arms: tuple[str, str], label: str,
                choose: Callable[[str], None], threads: int = 1) -> list[str]:
    """`state` saved by one rank (`threads` writer threads: a file each) into a new store,
    then loaded cold with each arm in turn (`choose(arm)` sets it), alternating; the rows."""
    import torch
    import torch.distributed.checkpoint as dcp

    import cowfs.dcp

    times: dict[str, list[float]] = {a: [] for a in arms}
    cpu: dict[str, list[float]] = {a: [] for a in arms}
    store = init_store(work / f"store-{threads}")
    with mounted(store, work / f"mnt-{threads}") as m, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # dcp without a process group says so
        where = work / f"mnt-{threads}" / "ckpt"
        dcp.save(state, storage_writer=cowfs.dcp.Writer(where, thread_count=threads))
        for k in range(reps):
            for arm in arms if k % 2 == 0 else arms[::-1]:
                choose(arm)
                target = {key: torch.empty_like(v) for key, v in state.items()}
                drop_caches()
                c0, t0 = cpu_seconds(m.pid), time.perf_counter()
                dcp.load(target, storage_reader=cowfs.dcp.Reader(where))
                times[arm].append(time.perf_counter() - t0)
                cpu[arm].append(cpu_seconds(m.pid) - c0)
                assert all(torch.equal(target[key], v) for key, v in state.items()), arm
    rows = []
    for arm in arms:
        rows += [_line(f"{label}, {arm}, s", times[arm]), _line("the same, daemon CPU s", cpu[arm])]
    return rows


def loads(state: dict[str, Any], work: Path, reps: int, window: int) -> list[str]:
    """The one-file checkpoint: got in windows of `window` bytes, and in one whole get."""
    from cowfs.plugins import get

    before = get.WINDOW
    try:
        return _cold_loads(state, work, reps, ARMS, "cold dcp.load, cowfs.dcp.Reader",
                           lambda arm: setattr(get, "WINDOW", window if arm == "windows" else 1 << 62))
    finally:
        get.WINDOW = before


def file_loads(state: dict[str, Any], work: Path, reps: int, files: int) -> list[str]:
    """A checkpoint of `files` files (the writer's threads), loaded in one process: the next
    file got while one is read, and each got when it is opened."""
    import cowfs.plugins.dcp_storage as dcp_storage

    arms = ("next file got ahead", "each file when opened")
    try:
        return _cold_loads(state, work, reps, arms, f"cold dcp.load of {files} files",
                           lambda arm: setattr(dcp_storage, "GET_AHEAD", arm == arms[0]), threads=files)
    finally:
        dcp_storage.GET_AHEAD = True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=2560, help="MiB of tensors in the one file")
    parser.add_argument("--window-mib", type=int, default=1024, help="the window of the first arm")
    parser.add_argument("--files", type=int, default=4, help="files of the second checkpoint (0: not run)")
    parser.add_argument("--files-mib", type=int, default=1024, help="MiB of tensors in the second checkpoint")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--dir", type=Path, default=Path("/var/tmp"))
    args = parser.parse_args()
    if min(args.mib, args.window_mib, args.reps, args.files_mib) < 1 or args.files < 0:
        parser.error("--mib, --window-mib, --files-mib and --reps are at least 1, --files at least 0")
    state = state_of(args.mib)
    several = state_of(args.files_mib) if args.files else {}
    print_table(f"a {args.mib} MiB one-file DCP checkpoint, windows of {args.window_mib} MiB; a {args.files_mib} MiB "
                f"checkpoint in {args.files} files; {args.reps} reps per arm, alternating", "cowfs-bench-windowed-",
                args.dir, lambda work: loads(state, work, args.reps, args.window_mib << 20)
                + (file_loads(several, work, args.reps, args.files) if args.files else []))


if __name__ == "__main__":
    main()
