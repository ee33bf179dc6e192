"""The entropy coder behind codec 4, chosen by measurement (issue 36): constriction's ANS
coder (a well-kept Rust library with Python bindings) against cowfs's native fdelta, on the
weight pieces of a Trainer series.

    pip install --target /tmp/constriction constriction==0.5.0
    PYTHONPATH=/tmp/constriction python -m tools.bench.coder_compare --series-dir DIR

constriction codes the same symbols (each element's bit length of the difference from the
newer checkpoint) with the same model (a categorical table per exponent bucket), the
symbols of a bucket in one call (its fastest use from Python); its time covers the symbols
alone, without the raw bits below each leading one, the buckets or putting the elements
back together, which fdelta's covers. Best of --reps per piece, one thread.

A bench tool: cowfs/ never imports it; constriction is not a dependency of cowfs.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from cowfs import _native
from cowfs.store.log.codecs import FDELTA_LANES, FDELTA_WRITTEN, FLOAT_FORMATS

from .pieces import base_index, load_series

EBUCKETS = 16
LANES = FDELTA_LANES[FDELTA_WRITTEN]  # the float delta the store writes: its rANS states


def symbols(raw: memoryview, base: memoryview) -> tuple[np.ndarray, np.ndarray]:
    """(bit length of zigzag(raw - base), exponent bucket of base) per bf16 element."""
    x = np.frombuffer(raw, np.uint16).astype(np.int64)
    y = np.frombuffer(base, np.uint16).astype(np.int64)
    d = (x - y) & 0xFFFF
    z = ((d << 1) ^ np.where(d >> 15, 0xFFFF, 0)) & 0xFFFF
    length = np.where(z > 0, np.floor(np.log2(np.maximum(z, 1))) + 1, 0).astype(np.int32)
    e = (y >> 7) & 0xFF
    finite = e[e < 255]
    top = int(finite.max()) if finite.size else 0
    return length, np.clip(e - max(top - (EBUCKETS - 1), 0), 0, EBUCKETS - 1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.bench.coder_compare", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--series-dir", type=Path, required=True, help="a bf16 Trainer series (tools/bench/seriescache.py)")
    ap.add_argument("--pieces", type=int, default=16, help="weight pieces of 1 MiB to code")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args(argv)
    try:
        import constriction  # type: ignore[import-not-found]
    except ImportError:
        print("coder_compare: constriction is not installed (see the docstring)", file=sys.stderr)
        return 2
    series = load_series(args.series_dir, 1 << 20)
    if len(series) < 2:
        print(f"coder_compare: {args.series_dir}: fewer than two checkpoints", file=sys.stderr)
        return 2
    pairs = []
    for vi in range(len(series) - 1):
        v, newer = series[vi], series[vi + 1]
        for i, j in enumerate(base_index(v, newer)):
            p = v.pieces[i]
            if j is not None and p.category == "model.safetensors:param" and p.dtype == "BF16" and p.length == 1 << 20:
                pairs.append((v.view(p), newer.view(newer.pieces[j])))
    pairs = pairs[:args.pieces]
    if not pairs:
        print("coder_compare: no 1 MiB bf16 weight pieces in the series", file=sys.stderr)
        return 2
    t = {"c enc": 0.0, "c dec": 0.0, "f enc": 0.0, "f dec": 0.0}
    size = {"c": 0, "f": 0}
    total = 0
    for raw, base in pairs:
        length, bucket = symbols(raw, base)
        groups = [length[bucket == k] for k in range(EBUCKETS)]
        models = [constriction.stream.model.Categorical((np.bincount(g, minlength=17) / g.size).astype(np.float32),
                                                        perfect=False) if g.size else None for g in groups]
        best = {k: float("inf") for k in t}
        for _ in range(args.reps):
            t0 = time.perf_counter()
            coder = constriction.stream.stack.AnsCoder()
            for g, m in zip(reversed(groups), reversed(models)):
                if m is not None:
                    coder.encode_reverse(g, m)
            comp = coder.get_compressed()
            t1 = time.perf_counter()
            dec = constriction.stream.stack.AnsCoder(comp)
            out = [dec.decode(m, g.size) if m is not None else g for g, m in zip(groups, models)]
            t2 = time.perf_counter()
            payload = _native.fdelta_encode(raw, base, *FLOAT_FORMATS["BF16"], 1 << 30, LANES)
            t3 = time.perf_counter()
            back = bytearray(len(raw))
            _native.fdelta_decode(payload, base, back, LANES)
            t4 = time.perf_counter()
            for k, dt in (("c enc", t1 - t0), ("c dec", t2 - t1), ("f enc", t3 - t2), ("f dec", t4 - t3)):
                best[k] = min(best[k], dt)
        if not all((o == g).all() for o, g in zip(out, groups)) or bytes(back) != bytes(raw):
            print("coder_compare: a coder did not round-trip", file=sys.stderr)
            return 1
        for k in t:
            t[k] += best[k]
        size["c"] += comp.nbytes + int(np.maximum(length - 1, 0).sum() + 7) // 8
        size["f"] += len(payload)
        total += len(raw)
    mb = total / 1e6
    print(f"{len(pairs)} bf16 weight pieces, {mb:.1f} MB, best of {args.reps}, one thread\n")
    print("| coder | what is timed | encode MB/s | decode MB/s | stored / logical |")
    print("| --- | --- | --- | --- | --- |")
    print(f"| constriction 0.5.0 AnsCoder, a Categorical per bucket | the symbols alone | {mb / t['c enc']:.0f}"
          f" | {mb / t['c dec']:.0f} | {size['c'] / total:.4f} (with the raw bits) |")
    print(f"| cowfs fdelta (native/fdelta_*.c) | the whole codec | {mb / t['f enc']:.0f} | {mb / t['f dec']:.0f}"
          f" | {size['f'] / total:.4f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
