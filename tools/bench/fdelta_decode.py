"""`python -m tools.bench.fdelta_decode`: how fast the float delta decodes, one core.

    python -m tools.bench.fdelta_decode [--elements N] [--reps R] [--code DIR ...]

A weight that moved by one optimizer step (normal(0, 0.02), a step of normal(0, 1e-4)) in
bf16 and f32, encoded once per codec the tree has: codec 4 (4 rANS states) everywhere, and
in a tree with codec 5 (32 states) that codec's plain C steps ("5 plain") and the steps
this CPU runs ("5": AVX2 where it has it). Each arm then decodes each `--timings` times in
its own process and keeps the median. `--code DIR` adds an arm that runs another source
tree's build (a worktree of another commit with its extension built in place): the arms
alternate, `--reps` times, and the table gives each arm's MB/s of decoded bytes per codec
and its ratio to the first arm's codec 4 in the same repetition.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from tools.harnessutil import run_in_tree

from .docs import REPO

FORMATS = {"bf16": (2, 7, 8), "f32": (4, 23, 8)}

ARM = r"""
import json, sys, time
import numpy as np
from cowfs import _native
n, timings, formats = int(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])
rng = np.random.default_rng(3)
newer = rng.normal(0, 0.02, n).astype(np.float32)
older = newer + rng.normal(0, 1e-4, n).astype(np.float32)
codecs = [("4", None, True)]  # a tree from before codec 5 takes no lanes argument
if hasattr(_native, "fdelta_simd"):
    codecs = [("4", 4, True), ("5 plain", 32, False), ("5", 32, True)]
out = {}
for name, (elem, mant, ebits) in formats.items():
    if elem == 2:
        raw, base = ((a.view(np.uint32) >> 16).astype(np.uint16).tobytes() for a in (older, newer))
    else:
        raw, base = older.tobytes(), newer.tobytes()
    for codec, lanes, simd in codecs:
        more = () if lanes is None else (lanes,)
        payload = _native.fdelta_encode(raw, base, elem, mant, ebits, 1 << 40, *more)
        dest = bytearray(len(raw))
        seconds = []
        for _ in range(timings):
            t = time.perf_counter()
            _native.fdelta_decode(payload, base, dest, *more, *(() if lanes is None else (simd,)))
            seconds.append(time.perf_counter() - t)
        if dest != raw:
            raise SystemExit(f"{name}, codec {codec}: the decode differs from the raw bytes")
        out[f"{name} {codec}"] = {"mb_s": len(raw) / sorted(seconds)[len(seconds) // 2] / 1e6,
                                  "ratio": len(payload) / len(raw)}
print(json.dumps(out))
"""


def run_arm(code: Path, elements: int, timings: int) -> dict[str, dict[str, float]]:
    return json.loads(run_in_tree(code, ARM, str(elements), str(timings), json.dumps(FORMATS)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.bench.fdelta_decode", description=__doc__.splitlines()[0])
    ap.add_argument("--elements", type=int, default=1 << 21, help="elements per piece (default 2 Mi)")
    ap.add_argument("--reps", type=int, default=3, help="repetitions of every arm, alternating")
    ap.add_argument("--timings", type=int, default=15, help="decodes per arm and format (the median is kept)")
    ap.add_argument("--code", type=Path, action="append", default=[], help="another source tree to compare")
    args = ap.parse_args(argv)
    if args.elements < 1 or args.reps < 1 or args.timings < 1:
        ap.error("--elements, --reps and --timings must be at least 1")
    arms = [REPO, *(c.resolve() for c in args.code)]
    for c in arms[1:]:
        if not (c / "cowfs").is_dir():
            ap.error(f"--code {c}: no cowfs/ there")
    runs: list[list[dict[str, dict[str, float]]]] = [[] for _ in arms]  # per arm (the same tree may come twice)
    for _ in range(args.reps):
        for arm, mine in zip(arms, runs):
            mine.append(run_arm(arm, args.elements, args.timings))
    print(f"fdelta decode, {args.elements} elements, median of {args.timings} decodes, {args.reps} reps per arm\n")
    print("| arm | format, codec | stored / raw | MB/s (each rep) | median | vs the first arm's codec 4 (each rep) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for arm, mine in zip(arms, runs):
        for key in mine[0]:
            speeds = [r[key]["mb_s"] for r in mine]
            first = [f"{key.split()[0]} 4" for _ in mine]
            ratios = [r[key]["mb_s"] / ref[k]["mb_s"] for r, ref, k in zip(mine, runs[0], first)]
            print(f"| {arm} | {key} | {mine[0][key]['ratio']:.3f} | {' / '.join(f'{v:.0f}' for v in speeds)} | "
                  f"{statistics.median(speeds):.0f} | {' / '.join(f'{v:.2f}' for v in ratios)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
