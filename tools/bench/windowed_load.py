"""A cold DCP load of a one-file checkpoint larger than a get's window (issue 34's gets in
windows), two ways alternating in one process:

    python -m tools.bench.windowed_load [--mib 2560] [--window-mib 1024] [--reps 5] [--dir /var/tmp]

* `cowfs.dcp.Reader` getting the file a window at a time (`get.WINDOW` = --window-mib), the
  next window got while DCP copies items out of this one, three windows held at most;
* `cowfs.dcp.Reader` getting the whole file in one memfd, as before windows (`WINDOW` past
  the file's size).

The checkpoint: MIB of fp32 tensors of 64 MiB each, saved by one rank with
`cowfs.dcp.Writer` (one .distcp file). Prints the seconds and the daemon's CPU seconds,
median [min-max], and checks every load. A bench tool: cowfs/ never imports it.
"""
from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path
from typing import Any

from .kept_memfds import _line, print_table
from .mounting import cpu_seconds, drop_caches, init_store, mounted

ARMS = ("windows", "whole file")
TENSOR_MIB = 64


def state_of(mib: int, tensor_mib: int = TENSOR_MIB) -> dict[str, Any]:
    import torch

    return {f"t{i}": torch.randn(tensor_mib << 18) for i in range(max(1, mib // tensor_mib))}


def loads(state: dict[str, Any], work: Path, reps: int, window: int) -> list[str]:
    import torch
    import torch.distributed.checkpoint as dcp

    import cowfs.dcp
    from cowfs.plugins import get

    store = init_store(work / "store")
    times: dict[str, list[float]] = {a: [] for a in ARMS}
    cpu: dict[str, list[float]] = {a: [] for a in ARMS}
    before = get.WINDOW
    with mounted(store, work / "mnt") as m, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # dcp without a process group says so
        where = work / "mnt" / "ckpt"
        dcp.save(state, storage_writer=cowfs.dcp.Writer(where))
        try:
            for k in range(reps):
                for arm in ARMS if k % 2 == 0 else ARMS[::-1]:
                    get.WINDOW = window if arm == "windows" else 1 << 62
                    target = {key: torch.empty_like(v) for key, v in state.items()}
                    drop_caches()
                    c0, t0 = cpu_seconds(m.pid), time.perf_counter()
                    dcp.load(target, storage_reader=cowfs.dcp.Reader(where))
                    times[arm].append(time.perf_counter() - t0)
                    cpu[arm].append(cpu_seconds(m.pid) - c0)
                    assert all(torch.equal(target[key], v) for key, v in state.items()), arm
        finally:
            get.WINDOW = before
    rows = []
    for arm in ARMS:
        rows += [_line(f"cold dcp.load, cowfs.dcp.Reader, {arm}, s", times[arm]),
                 _line("the same, daemon CPU s", cpu[arm])]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=2560, help="MiB of tensors in the one file")
    parser.add_argument("--window-mib", type=int, default=1024, help="the window of the first arm")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--dir", type=Path, default=Path("/var/tmp"))
    args = parser.parse_args()
    if args.mib < 1 or args.window_mib < 1 or args.reps < 1:
        parser.error("--mib, --window-mib and --reps are at least 1")
    state = state_of(args.mib)
    print_table(f"a {args.mib} MiB one-file DCP checkpoint, windows of {args.window_mib} MiB, {args.reps} reps per "
                "arm, alternating", "cowfs-bench-windowed-", args.dir,
                lambda work: loads(state, work, args.reps, args.window_mib << 20))


if __name__ == "__main__":
    main()
