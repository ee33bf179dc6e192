"""Measure piece codecs on checkpoint series: stored/logical, encode and decode MB/s.

    python -m tools.bench.codecs /tmp/cs/bf16 /tmp/cs/fp32 --json out.json --md out.md

A series is a directory of versions (see tools/bench/ckptformat.py: Trainer's
checkpoint-N/ directories, or tools.bench.trainer_series --plain's save-N/). Tensors are
cut into pieces (1 MiB default); every candidate codes every piece of every version whole,
and as a delta (each transform of codeclib.TRANSFORMS) against the same piece of the
previous version. A piece costs min(blob, raw) bytes (no per-piece index counted). The
non-tensor bytes of each version (headers, data.pkl, zip records, small files) are zstd-3'd
as one stream per version and counted in every candidate's total (raw size in the JSON).

Throughput: on the newest version (whole) and the newest against the previous (delta,
including the transform and, for decode, undoing it), `--reps` repetitions; MB = 1e6
bytes of checkpoint (piece) data; single thread, 2 Python threads over pieces (the
libraries release the GIL), and for libraries with their own threads one caller with
nthreads=2. The schemes (chains.py) are computed for `--scheme-coders` (default: the two
best by forward-delta total) with the deltas every layout needs.

A bench tool: cowfs/ never imports it; it needs no torch (zipnn, if installed, does).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import numpy as np
import zstandard

from . import chains
from .ckptformat import Piece, Version, load_version, versions
from .codeclib import TRANSFORMS, Coder, Transform, all_coders, stored_size

Job = tuple[Piece, np.ndarray, np.ndarray | None]  # piece, its bytes, its base's bytes (delta) or None


def as_u8(mv: memoryview) -> np.ndarray:
    return np.frombuffer(mv, np.uint8)


def pair_jobs(target: Version, base: Version | None) -> list[Job]:
    index = {p.match: p for p in base.pieces} if base is not None else {}
    jobs: list[Job] = []
    for p in target.pieces:
        b = index.get(p.match)
        jobs.append((p, as_u8(target.view(p)), as_u8(base.view(b)) if b is not None else None))
    return jobs


def encode_job(coder: Coder, transform: Transform | None, job: Job) -> bytes:
    p, data, base = job
    if transform is not None and base is not None:
        data = transform.forward(data, base, p.itemsize)
    return coder.encode(data, p.itemsize)


def piece_sizes(coder: Coder, transform: Transform | None, jobs: list[Job],
                pool: ThreadPoolExecutor) -> np.ndarray:
    """Stored bytes of each job's piece (in order)."""
    blobs = pool.map(lambda j: encode_job(coder, transform, j), jobs)
    return np.array([stored_size(blob, p.nbytes) for (p, _, _), blob in zip(jobs, blobs)], np.int64)


def by_category(pieces: list[Piece], sizes: np.ndarray) -> dict[str, int]:
    out: dict[str, int] = {}
    for p, n in zip(pieces, sizes):
        out[p.category] = out.get(p.category, 0) + int(n)
    return out


def identical_stats(series: list[Version]) -> dict[str, Any]:
    """Per category over consecutive pairs: share of elements bit-identical, and per byte
    position (0 = most significant) share of XOR bytes that are zero."""
    same: dict[str, list[int]] = {}
    zero: dict[str, np.ndarray] = {}
    for prev, cur in zip(series, series[1:]):
        for p, data, base in pair_jobs(cur, prev):
            if base is None or p.itemsize not in (1, 2, 4, 8):
                continue
            dt = np.dtype(f"u{p.itemsize}")
            a, b = data.view(dt), base.view(dt)
            s = same.setdefault(p.category, [0, 0])
            s[0] += int(np.count_nonzero(a == b))
            s[1] += a.size
            x = np.bitwise_xor(data, base).reshape(-1, p.itemsize)
            z = (x == 0).sum(axis=0)[::-1]  # little endian: reverse to most significant first
            zero[p.category] = zero.get(p.category, 0) + z
    return {cat: {"identical_elements": s[0] / max(s[1], 1),
                  "xor_zero_bytes_msb_first": [round(float(v) / max(s[1], 1), 4) for v in zero[cat]]}
            for cat, s in same.items()}


def measure_ratios(series: list[Version], coders: dict[str, Coder], transforms: list[str],
                   jobs_n: int) -> tuple[dict[str, Any], dict[str, list[np.ndarray]]]:
    """Per coder: every version whole, and each version as a delta against the previous
    one ("delta", every piece a delta) and "best" (per piece the smaller of whole and
    delta, as a store that keeps whichever is smaller would). Returns the summary per
    category and the per-piece whole sizes (for the schemes)."""
    out: dict[str, Any] = {}
    whole_sizes: dict[str, list[np.ndarray]] = {}
    with ThreadPoolExecutor(jobs_n) as pool:
        for name, coder in coders.items():
            t0 = time.perf_counter()
            whole = [piece_sizes(coder, None, pair_jobs(v, None), pool) for v in series]
            whole_sizes[name] = whole
            r: dict[str, Any] = {"whole": [by_category(v.pieces, w) for v, w in zip(series, whole)],
                                 "delta_prev": {}, "best_prev": {}}
            for t in transforms:
                deltas = [whole[0]] + [piece_sizes(coder, TRANSFORMS[t], pair_jobs(cur, prev), pool)
                                       for prev, cur in zip(series, series[1:])]
                r["delta_prev"][t] = [by_category(v.pieces, d) for v, d in zip(series, deltas)]
                r["best_prev"][t] = [by_category(v.pieces, np.minimum(d, w))
                                     for v, d, w in zip(series, deltas, whole)]
            r["seconds"] = round(time.perf_counter() - t0, 1)
            out[name] = r
            print(f"  ratios {name}: {r['seconds']} s", file=sys.stderr)
    return out, whole_sizes


def timed(fn: Callable[[], None], reps: int) -> list[float]:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def mbps(nbytes: int, times: list[float]) -> dict[str, float]:
    rates = sorted(nbytes / t / 1e6 for t in times)
    return {"median": round(statistics.median(rates), 1), "min": round(rates[0], 1), "max": round(rates[-1], 1)}


def decode_job(coder: Coder, transform: Transform | None, job: Job, blob: bytes) -> np.ndarray:
    p, _, base = job
    out = coder.decode(blob, p.itemsize, p.nbytes)
    if transform is not None and base is not None:
        out = transform.inverse(out, base, p.itemsize)
    return out


def measure_speed(jobs: list[Job], coder: Coder, transform: Transform | None, reps: int) -> dict[str, Any]:
    nbytes = sum(p.nbytes for p, _, _ in jobs)
    enc = lambda j: encode_job(coder, transform, j)  # noqa: E731
    blobs = [enc(j) for j in jobs]
    ok = all(np.array_equal(decode_job(coder, transform, j, b), j[1]) for j, b in zip(jobs, blobs))
    dec_pairs = list(zip(jobs, blobs))
    dec = lambda jb: decode_job(coder, transform, jb[0], jb[1])  # noqa: E731
    res: dict[str, Any] = {"roundtrip_ok": ok, "mb": round(nbytes / 1e6, 1)}
    coder.set_threads(1)
    res["enc_1t"] = mbps(nbytes, timed(lambda: [enc(j) for j in jobs], reps))
    res["dec_1t"] = mbps(nbytes, timed(lambda: [dec(jb) for jb in dec_pairs], reps))
    with ThreadPoolExecutor(2) as pool:
        res["enc_2t"] = mbps(nbytes, timed(lambda: list(pool.map(enc, jobs)), reps))
        res["dec_2t"] = mbps(nbytes, timed(lambda: list(pool.map(dec, dec_pairs)), reps))
    if coder.internal_threads:
        coder.set_threads(2)
        res["enc_lib2t"] = mbps(nbytes, timed(lambda: [enc(j) for j in jobs], reps))
        res["dec_lib2t"] = mbps(nbytes, timed(lambda: [dec(jb) for jb in dec_pairs], reps))
        coder.set_threads(1)
    return res


def measure_schemes(series: list[Version], coder: Coder, transform: str, jobs_n: int,
                    whole: list[np.ndarray]) -> dict[tuple[int, int], int]:
    """Tensor bytes of every (target, base) delta the layouts need, each piece the smaller
    of its delta and its whole coding (XOR deltas are symmetric: measured once)."""
    delta: dict[tuple[int, int], int] = {}
    per_piece: dict[tuple[int, int], np.ndarray] = {}
    t = TRANSFORMS[transform]
    with ThreadPoolExecutor(jobs_n) as pool:
        for (i, b) in sorted(chains.needed_pairs(len(series))):
            same_pieces = [p.match for p in series[i].pieces] == [p.match for p in series[b].pieces]
            if transform == "xor" and (b, i) in per_piece and same_pieces:
                d = per_piece[(b, i)]
            else:
                d = piece_sizes(coder, t, pair_jobs(series[i], series[b]), pool)
            per_piece[(i, b)] = d
            delta[(i, b)] = int(np.minimum(d, whole[i]).sum())
    return delta


def run_series(path: Path, args: argparse.Namespace, coders: dict[str, Coder]) -> dict[str, Any]:
    t0 = time.perf_counter()
    series = [load_version(v, args.piece_kib << 10) for v in versions(path)]
    print(f"{path}: {len(series)} versions loaded in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    logical = [v.logical for v in series]
    zc = zstandard.ZstdCompressor(level=3)
    rest_raw = [len(v.rest) for v in series]
    rest = [len(zc.compress(v.rest)) for v in series]
    cat_logical: dict[str, int] = {}
    for v in series:
        for p in v.pieces:
            cat_logical[p.category] = cat_logical.get(p.category, 0) + p.nbytes
    tensor = [sum(p.nbytes for p in v.pieces) for v in series]
    res: dict[str, Any] = {
        "series": str(path), "versions": [v.name for v in series], "piece_bytes": args.piece_kib << 10,
        "logical": logical, "tensor_bytes": tensor, "rest_raw": rest_raw, "rest_zstd3": rest,
        "category_logical": cat_logical, "identical": identical_stats(series),
    }
    res["ratios"], whole_sizes = measure_ratios(series, coders, args.transforms, args.jobs)
    total_logical, total_rest = sum(logical), sum(rest)
    best: list[tuple[float, str, str]] = []
    for name, r in res["ratios"].items():
        r["whole_ratio"] = (sum(sum(c.values()) for c in r["whole"]) + total_rest) / total_logical
        r["delta_ratio"], r["best_ratio"] = {}, {}
        for t in r["delta_prev"]:
            r["delta_ratio"][t] = (sum(sum(c.values()) for c in r["delta_prev"][t]) + total_rest) / total_logical
            r["best_ratio"][t] = (sum(sum(c.values()) for c in r["best_prev"][t]) + total_rest) / total_logical
            best.append((r["best_ratio"][t], name, t))
    best.sort()
    if not args.no_speed:
        res["speed"] = {}
        whole_jobs = pair_jobs(series[-1], None)
        delta_jobs = pair_jobs(series[-1], series[-2])
        for name, coder in coders.items():
            res["speed"][name] = {"whole": measure_speed(whole_jobs, coder, None, args.reps)}
            for t in args.speed_transforms:
                res["speed"][name][t] = measure_speed(delta_jobs, coder, TRANSFORMS[t], args.reps)
            print(f"  speed {name}: {res['speed'][name]['whole']['enc_1t']}", file=sys.stderr)
    scheme_coders = args.scheme_coders or []
    if not scheme_coders:
        for _, name, t in best:
            if f"{name}/{t}" not in scheme_coders:
                scheme_coders.append(f"{name}/{t}")
            if len(scheme_coders) == 2:
                break
    res["schemes"] = {}
    for spec in scheme_coders:
        name, t = spec.rsplit("/", 1)
        r = res["ratios"][name]
        whole = [sum(c.values()) for c in r["whole"]]
        delta = measure_schemes(series, coders[name], t, args.jobs, whole_sizes[name])
        res["schemes"][spec] = {
            "rows": chains.evaluate(whole, delta, tensor, rest, logical),
            "delta": {f"{i}<-{b}": v for (i, b), v in sorted(delta.items())},
        }
        print(f"  schemes {spec} done", file=sys.stderr)
    res["seconds"] = round(time.perf_counter() - t0, 1)
    return res


def fmt_speed(s: dict[str, Any] | None, key: str) -> str:
    if not s or key not in s:
        return "-"
    v = s[key]
    return f"{v['median']:.0f} ({v['min']:.0f}-{v['max']:.0f})"


def _cat_ratio(per_version: list[dict[str, int]], cat: str, logical: int) -> float:
    return sum(v.get(cat, 0) for v in per_version) / logical


def markdown(res: dict[str, Any], transforms: list[str]) -> str:
    n = len(res["versions"])
    out = [f"### {res['series']} ({n} versions, {sum(res['logical']) / 1e6:.1f} MB logical, "
           f"pieces {res['piece_bytes'] >> 10} KiB)", "",
           "Stored/logical over the series. 'delta T': version 1..n-1 every piece a delta (transform T) "
           "against the previous version; 'best T': per piece the smaller of delta and whole.", ""]
    head = "| codec | all whole | " + " | ".join(f"delta {t} | best {t}" for t in transforms) + " |"
    out += [head, "|" + "---|" * (head.count("|") - 1)]
    for name, r in res["ratios"].items():
        cells = [name, f"{r['whole_ratio']:.3f}"]
        for t in transforms:
            cells += [f"{r['delta_ratio'][t]:.3f}", f"{r['best_ratio'][t]:.3f}"]
        out.append("| " + " | ".join(cells) + " |")
    if res.get("speed"):
        out += ["", "MB/s of piece data (1e6 B), median (min-max); 1T = one thread, 2T = two Python threads "
                "over pieces, lib 2T = one caller, library nthreads=2; xor = transform included:", ""]
        head = ("| codec | enc 1T | enc 2T | enc lib 2T | dec 1T | dec 2T | xor enc 1T | xor enc 2T "
                "| xor dec 1T | xor dec 2T | round trip |")
        out += [head, "|" + "---|" * (head.count("|") - 1)]
        for name, sp in res["speed"].items():
            w, x = sp.get("whole"), sp.get("xor")
            ok = all(v.get("roundtrip_ok", False) for v in sp.values())
            cells = [name] + [fmt_speed(w, k) for k in ("enc_1t", "enc_2t", "enc_lib2t", "dec_1t", "dec_2t")]
            cells += [fmt_speed(x, k) for k in ("enc_1t", "enc_2t", "dec_1t", "dec_2t")] + [str(ok)]
            out.append("| " + " | ".join(cells) + " |")
    cats = sorted(res["category_logical"])
    out += ["", "Per file and tensor role, stored/logical of that category: whole / "
            + " / ".join(f"best {t}" for t in transforms), ""]
    out.append("| codec | " + " | ".join(f"{c} ({res['category_logical'][c] / 1e6:.0f} MB)" for c in cats) + " |")
    out.append("|" + "---|" * (len(cats) + 1))
    top = sorted(res["ratios"], key=lambda k: min(res["ratios"][k]["best_ratio"].values()))[:5]
    for name in top:
        r = res["ratios"][name]
        cells = []
        for c in cats:
            vals = [_cat_ratio(r["whole"], c, res["category_logical"][c])]
            vals += [_cat_ratio(r["best_prev"][t], c, res["category_logical"][c]) for t in transforms]
            cells.append(" / ".join(f"{v:.3f}" for v in vals))
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    out += ["", "Consecutive versions: share of elements bit-identical; share of zero XOR bytes, most "
            "significant byte first:", ""]
    for c, st in sorted(res["identical"].items()):
        out.append(f"- {c}: identical {st['identical_elements']:.3f}; zero XOR bytes {st['xor_zero_bytes_msb_first']}")
    for spec, sch in res.get("schemes", {}).items():
        out += ["", f"Schemes with {spec}, per piece the smaller of delta and whole (non-tensor bytes zstd-3; "
                "'newest left raw' = the newest version's tensors stored as written):", "",
                chains.markdown(sch["rows"])]
    out += ["", f"Non-tensor bytes: {sum(res['rest_raw']) / 1e6:.2f} MB raw, "
            f"{sum(res['rest_zstd3']) / 1e6:.2f} MB zstd-3 over the series."]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("series", nargs="+", type=Path)
    ap.add_argument("--piece-kib", type=int, default=1024)
    ap.add_argument("--coders", default="all", help="comma-separated names, or 'all'")
    ap.add_argument("--transforms", default="xor,zz", help=f"delta transforms, of {sorted(TRANSFORMS)}")
    ap.add_argument("--speed-transforms", default="xor")
    ap.add_argument("--scheme-coders", default="", help="'coder/transform,...' (default: the 2 best)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=2, help="threads for the ratio passes")
    ap.add_argument("--no-speed", action="store_true")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--md", type=Path)
    args = ap.parse_args(argv)
    args.transforms = [t for t in args.transforms.split(",") if t]
    args.speed_transforms = [t for t in args.speed_transforms.split(",") if t]
    args.scheme_coders = [s for s in args.scheme_coders.split(",") if s]
    coders = all_coders()
    if args.coders != "all":
        coders = {k: coders[k] for k in args.coders.split(",")}
    results = [run_series(s, args, coders) for s in args.series]
    md = "\n\n".join(markdown(r, args.transforms) for r in results)
    print(md)
    if args.md:
        args.md.write_text(md + "\n")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
