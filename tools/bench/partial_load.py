"""A model-only DCP load of a checkpoint that also holds the optimizer's state (an evaluation
job's load of a training checkpoint; issue 34's gets of ranges), cold, three ways alternating
in one process:

    python -m tools.bench.partial_load [--mib 256] [--reps 5] [--dir /var/tmp]

* `cowfs.dcp.Reader`, getting only the model's items (ranges);
* `cowfs.dcp.Reader` getting whole files, as before ranges (`RANGES_BELOW` 0);
* the stock FileSystemReader through the mount (FUSE reads of the items).

The checkpoint: MIB of fp32 weights and AdamW's two moments (3 x MIB), one rank. Prints the
seconds and the daemon's CPU seconds, median [min-max], and checks every load. A bench tool:
cowfs/ never imports it.
"""
from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path
from typing import Any

from .kept_memfds import _line, print_table
from .mounting import cpu_seconds, drop_caches, init_store, mounted

ARMS = ("cowfs.dcp.Reader, ranges", "cowfs.dcp.Reader, whole files", "FileSystemReader through the mount")


def checkpoint(mib: int) -> tuple[dict[str, Any], dict[str, Any]]:
    import torch

    n = 8
    per = (mib << 18) // n  # fp32 elements per tensor
    model = {f"layer{i}.weight": torch.randn(per) for i in range(n)}
    optim = {f"state.{i}.{k}": torch.randn(per) for i in range(n) for k in ("exp_avg", "exp_avg_sq")}
    return model, optim


def loads(model: dict[str, Any], optim: dict[str, Any], work: Path, reps: int) -> list[str]:
    import torch
    import torch.distributed.checkpoint as dcp

    import cowfs.dcp
    import cowfs.plugins.dcp_storage as dcp_storage

    store = init_store(work / "store")
    times: dict[str, list[float]] = {a: [] for a in ARMS}
    cpu: dict[str, list[float]] = {a: [] for a in ARMS}
    below = dcp_storage.RANGES_BELOW
    with mounted(store, work / "mnt") as m, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # dcp without a process group says so
        where = work / "mnt" / "ckpt"
        dcp.save({"model": model, "optim": optim}, storage_writer=cowfs.dcp.Writer(where))
        try:
            for k in range(reps):
                for arm in ARMS[k % 3:] + ARMS[:k % 3]:
                    dcp_storage.RANGES_BELOW = 0.0 if arm == ARMS[1] else below
                    reader = dcp.FileSystemReader(where) if arm == ARMS[2] else cowfs.dcp.Reader(where)
                    target = {"model": {key: torch.empty_like(v) for key, v in model.items()}}
                    drop_caches()
                    c0, t0 = cpu_seconds(m.pid), time.perf_counter()
                    dcp.load(target, storage_reader=reader)
                    times[arm].append(time.perf_counter() - t0)
                    cpu[arm].append(cpu_seconds(m.pid) - c0)
                    assert all(torch.equal(target["model"][key], v) for key, v in model.items()), arm
        finally:
            dcp_storage.RANGES_BELOW = below
    rows = []
    for arm in ARMS:
        rows += [_line(f"cold model-only dcp.load, {arm}, s", times[arm]), _line("the same, daemon CPU s", cpu[arm])]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=256, help="MiB of weights (the checkpoint is 3x this)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--dir", type=Path, default=Path("/var/tmp"))
    args = parser.parse_args()
    model, optim = checkpoint(args.mib)
    print_table(f"{args.mib} MiB of weights in a {3 * args.mib} MiB checkpoint, {args.reps} reps per arm, alternating",
                "cowfs-bench-partial-", args.dir, lambda work: loads(model, optim, work, args.reps))


if __name__ == "__main__":
    main()
