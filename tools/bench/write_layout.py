"""Tensor files pieced at write time (issue 33): a safetensors checkpoint (or a torch.save
archive) written through a store's write session with the pieces learnt from its header (or
its data.pkl), against the same session cutting everything by content (the layout switched
off on that session), arms alternating.

    python -m tools.bench.write_layout [--gib 0.5] [--reps 3] [--work DIR] [--format safetensors|torch]

The file: GPT-2-like float32 tensors (two large matrices and a small vector per layer),
random. Each run writes it in 1 MiB writes into a new store in --work (default /dev/shm, so
the disk does not count), commits, then writes it again under another name with a 5 KB
longer header (torch: a 5 KB string first in the state dict, so data.pkl is longer), which
moves every tensor. Printed per arm (median [min-max]): the process's
CPU seconds per GiB for the first write and commit, its wall GB/s, the extents (chunks) the
file got, and the bytes the shifted copy added to the store (what dedup missed).
"""
from __future__ import annotations

import argparse
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import io

import numpy as np
import torch
from safetensors.numpy import save

from cowfs.store import ROOT_INO, Store

GIB = 1 << 30
WRITE = 1 << 20
ARMS = ("content cut", "pieced at write")
FORMATS = ("safetensors", "torch")


def checkpoint(gib: float, seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    per_layer = 4 * (2 * 768 * 3072 + 768)
    layers = max(1, int(gib * GIB / per_layer))
    out = {}
    for i in range(layers):
        out[f"h.{i}.mlp.c_fc.weight"] = rng.standard_normal(768 * 3072, dtype=np.float32)
        out[f"h.{i}.mlp.c_proj.weight"] = rng.standard_normal(768 * 3072, dtype=np.float32)
        out[f"h.{i}.ln_1.weight"] = rng.standard_normal(768, dtype=np.float32)
    return out


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def write_through_session(store: Store, name: bytes, blob: bytes, pieced: bool,
                          parent: int = ROOT_INO) -> int:
    ino = store.create(parent, name).ino
    view = memoryview(blob)
    with store.open_session(ino) as s:
        if not pieced:
            s.layout = None  # the session cuts everything by content, as before write-time pieces
        for off in range(0, len(blob), WRITE):
            s.write(off, bytes(view[off:off + WRITE]))
        s.commit()
    return ino


def files(tensors: dict[str, np.ndarray], fmt: str) -> tuple[bytes, bytes]:
    """The checkpoint in `fmt`, and the same with every tensor moved by a longer header."""
    if fmt == "safetensors":
        return save(tensors), save(tensors, metadata={"note": "x" * 5000})
    as_torch = {k: torch.from_numpy(v) for k, v in tensors.items()}
    out = []
    for obj in (as_torch, {"note": "x" * 5000} | as_torch):
        buf = io.BytesIO()
        torch.save(obj, buf)
        out.append(buf.getvalue())
    return out[0], out[1]


def run_arm(arm: str, blob: bytes, shifted: bytes, work: Path) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="write-layout-", dir=work))
    try:
        Store.init(root / "store")
        with Store.open(root / "store") as store:
            pieced = arm == ARMS[1]
            c0, t0 = _cpu(), time.monotonic()
            write_through_session(store, b"model", blob, pieced)
            cpu, wall = _cpu() - c0, time.monotonic() - t0
            extents = store.catalog.read(lambda c: c.execute("SELECT count(*) FROM extents").fetchone()[0])
            before = store.stats()["stored_bytes"]
            write_through_session(store, b"shifted", shifted, pieced)
            added = store.stats()["stored_bytes"] - before
        return {"arm": arm, "cpu_s_per_gib": cpu / (len(blob) / GIB), "GBps": len(blob) / wall / 1e9,
                "extents": extents, "shifted_added": added}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run(gib: float, reps: int, work: Path, log=print, fmt: str = "safetensors") -> list[dict[str, Any]]:
    tensors = checkpoint(gib)
    blob, shifted = files(tensors, fmt)
    log(f"a {fmt} file of {len(blob) / GIB:.2f} GiB ({len(tensors)} tensors), {reps} rep(s) per arm")
    runs = []
    for rep in range(reps):
        for arm in (ARMS if rep % 2 == 0 else ARMS[::-1]):
            r = run_arm(arm, blob, shifted, work)
            log(f"  rep {rep + 1} {arm}: {r['cpu_s_per_gib']:.2f} CPU s/GiB, {r['GBps']:.2f} GB/s, "
                f"{r['extents']} extents, shifted copy added {r['shifted_added'] / 1e6:.2f} MB")
            runs.append(r)
    return runs


def cell(values: list[float], fmt: str) -> str:
    return f"{format(statistics.median(values), fmt)} [{format(min(values), fmt)}-{format(max(values), fmt)}]"


Column = tuple[str, Callable[[dict[str, Any]], float], str]  # header, value of a run, format


def table(runs: list[dict[str, Any]], columns: list[Column]) -> str:
    """One row per arm: median [min-max] of each column over the arm's runs."""
    lines = ["| arm | " + " | ".join(c[0] for c in columns) + " |", "| --- " * (len(columns) + 1) + "|"]
    for arm in ARMS:
        rs = [r for r in runs if r["arm"] == arm]
        if rs:
            lines.append(f"| {arm} | " + " | ".join(cell([get(r) for r in rs], fmt) for _h, get, fmt in columns) + " |")
    return "\n".join(lines)


def markdown(runs: list[dict[str, Any]]) -> str:
    return table(runs, [("CPU s per GiB written", lambda r: r["cpu_s_per_gib"], ".2f"),
                        ("GB/s", lambda r: r["GBps"], ".2f"), ("extents", lambda r: r["extents"], ".0f"),
                        ("shifted copy added, MB", lambda r: r["shifted_added"] / 1e6, ".2f")])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.bench.write_layout", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=0.5, help="the checkpoint's size (default 0.5)")
    ap.add_argument("--reps", type=int, default=3, help="runs per arm, alternating (default 3)")
    ap.add_argument("--work", type=Path, default=Path("/dev/shm"), help="where the stores go (default /dev/shm)")
    ap.add_argument("--format", choices=FORMATS, default="safetensors", help="the checkpoint's format")
    args = ap.parse_args(argv)
    if args.gib <= 0 or args.reps < 1:
        print("write_layout: --gib must be above 0 and --reps at least 1", file=sys.stderr)
        return 2
    if not args.work.is_dir():
        print(f"write_layout: --work {args.work} is not a directory", file=sys.stderr)
        return 2
    print(markdown(run(args.gib, args.reps, args.work, fmt=args.format)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
