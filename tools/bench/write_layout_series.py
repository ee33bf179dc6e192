"""Tensor files pieced at write time (issue 33), compacted: a short AdamW-like series of
torch.save checkpoints (bf16 weights in model.pt, fp32 exp_avg and exp_avg_sq in
optimizer.pt) written through a store's write sessions cut into pieces as they are written,
against the same sessions cutting by content; then `compact` + `gc`. What the store keeps
afterwards should not depend on how the save cut the files.

    python -m tools.bench.write_layout_series [--checkpoints 5] [--reps 2] [--work DIR]

The series: 6 matrices of 512 x 1024 updated by AdamW steps on random gradients, one step
per checkpoint (the same series for every run). Printed per arm (median [min-max]): stored
bytes / logical bytes after compact + gc, compaction seconds, the pieces compaction wrote
again (raw pieces the save stored, re-encoded) and the deltas it made.
"""
from __future__ import annotations

import argparse
import io
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from cowfs.store import ROOT_INO, Store

from .write_layout import ARMS, table, write_through_session


def series(checkpoints: int) -> list[dict[str, bytes]]:
    """Each checkpoint's files: model.pt and optimizer.pt, as torch.save writes them."""
    g = torch.Generator().manual_seed(0)
    w = {f"l{i}.w": torch.randn(512, 1024, generator=g) * 0.02 for i in range(6)}
    m = {k: torch.zeros_like(v) for k, v in w.items()}
    v2 = {k: torch.zeros_like(v) for k, v in w.items()}
    out = []
    for t in range(checkpoints):
        for k in w:
            grad = torch.randn(w[k].shape, generator=g) * 1e-3
            m[k] = 0.9 * m[k] + 0.1 * grad
            v2[k] = 0.999 * v2[k] + 0.001 * grad * grad
            w[k] = w[k] - 1e-3 * m[k] / (v2[k].sqrt() + 1e-8)
        optim = {"state": {i: {"step": torch.tensor(float(t + 1)), "exp_avg": m[k].clone(), "exp_avg_sq": v2[k].clone()}
                           for i, k in enumerate(w)},
                 "param_groups": [{"lr": 1e-3, "params": list(range(len(w)))}]}
        files = {}
        for name, obj in (("model.pt", {k: v.bfloat16() for k, v in w.items()}), ("optimizer.pt", optim)):
            buf = io.BytesIO()
            torch.save(obj, buf)
            files[name] = buf.getvalue()
        out.append(files)
    return out


def run_arm(arm: str, checkpoints: list[dict[str, bytes]], work: Path) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="write-layout-series-", dir=work))
    try:
        Store.init(root / "store")
        with Store.open(root / "store") as store:
            logical = 0
            for t, files in enumerate(checkpoints):
                d = store.mkdir(ROOT_INO, f"checkpoint-{t}".encode()).ino
                for name, blob in files.items():
                    write_through_session(store, name.encode(), blob, arm == ARMS[1], parent=d)
                    logical += len(blob)
            t0 = time.monotonic()
            report = store.compact()
            seconds = time.monotonic() - t0
            store.gc()
            stored = store.stats()["stored_bytes"]
        return {"arm": arm, "stored_ratio": stored / logical, "compact_s": seconds, "rewritten": report.rewritten,
                "deltas": report.deltas}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run(checkpoints: int, reps: int, work: Path, log=print) -> list[dict[str, Any]]:
    ckpts = series(checkpoints)
    log(f"{checkpoints} checkpoints of {sum(map(len, ckpts[0].values())) / 1e6:.1f} MB, {reps} rep(s) per arm")
    runs = []
    for rep in range(reps):
        for arm in (ARMS if rep % 2 == 0 else ARMS[::-1]):
            r = run_arm(arm, ckpts, work)
            log(f"  rep {rep + 1} {arm}: stored/logical {r['stored_ratio']:.4f}, compact {r['compact_s']:.2f} s, "
                f"rewritten {r['rewritten']}, deltas {r['deltas']}")
            runs.append(r)
    return runs


def markdown(runs: list[dict[str, Any]]) -> str:
    return table(runs, [("stored / logical after compact + gc", lambda r: r["stored_ratio"], ".4f"),
                        ("compact s", lambda r: r["compact_s"], ".2f"),
                        ("pieces rewritten", lambda r: r["rewritten"], ".0f"),
                        ("deltas", lambda r: r["deltas"], ".0f")])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.bench.write_layout_series", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoints", type=int, default=5, help="checkpoints in the series (default 5)")
    ap.add_argument("--reps", type=int, default=2, help="runs per arm, alternating (default 2)")
    ap.add_argument("--work", type=Path, default=Path("/dev/shm"), help="where the stores go (default /dev/shm)")
    args = ap.parse_args(argv)
    if args.checkpoints < 2 or args.reps < 1:
        print("write_layout_series: --checkpoints must be at least 2 and --reps at least 1", file=sys.stderr)
        return 2
    if not args.work.is_dir():
        print(f"write_layout_series: --work {args.work} is not a directory", file=sys.stderr)
        return 2
    print(markdown(run(args.checkpoints, args.reps, args.work)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
