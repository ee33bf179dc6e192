"""Checkpoint codec measurement (issue 14): what each codec and delta layout would store for
a real Trainer checkpoint series, and how fast it encodes and decodes.

    python -m tools.bench.codecs --work /var/tmp/cowfs-codecs --peers --md out.md --json out.json

For each series (default: a bf16 and an fp32 HF Trainer run; tools/bench/trainer_series.py,
built under --work unless already there), every file is cut the way the engine will cut it
(tools/bench/pieces.py: cowfs.store.tensors.formats regions, 1 MiB element-aligned pieces, FastCDC
for the non-tensor rest). Every coder (tools/bench/codeclib.py) codes every piece whole,
and as a delta (XOR, zigzag subtraction) against the same piece of the next newer version;
the layouts (tools/bench/schemes.py) are priced from those sizes. The non-tensor rest is
priced once (deduplicated chunks, the engine's encode_whole) and added to every row, as is
global dedup of identical pieces. Throughput is measured on the newest version (whole) and
the one before it against it (deltas), --reps times. --peers stores the same series in
restic and borg (tools/bench/peers.py).

A bench tool: cowfs/ never imports it.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import blosc2
import numpy as np

from cowfs.store.data.chunking import chunk_id, cut_all

from . import peers, schemes, seriescache
from .codeclib import TRANSFORMS, all_coders
from .codecmeasure import bit_stats, jobs_of, measure_sizes, measure_speed, rest_cost
from .pieces import Version, load_series

KS = (2, 4, 8, 0)  # keyframe distances of the reverse chain (0: none)
MAIN_COLUMNS = ["whole", "forward xor", "reverse xor K=4", "reverse xor K=8", "reverse xor K=inf",
                "reverse sub K=4", "reverse sub K=8"]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def cdc_today(series: list[Version]) -> int:
    """What cowfs stores today: every file cut by FastCDC, identical chunks once, raw."""
    seen: set[bytes] = set()
    total = 0
    for v in series:
        for data in v.files.values():
            for c in cut_all(data):
                cid = chunk_id(c)
                if cid not in seen:
                    seen.add(cid)
                    total += len(c)
    return total


def run_series(name: str, path: Path, args: argparse.Namespace) -> dict[str, Any]:
    t0 = time.perf_counter()
    series = load_series(path, args.piece_kib << 10)
    logical = sum(v.logical for v in series)
    log(f"{name}: {len(series)} versions, {logical / 1e6:.1f} MB, loaded in {time.perf_counter() - t0:.1f} s")
    rest_raw, rest_stored = rest_cost(series)
    res: dict[str, Any] = {
        "series": name, "path": str(path), "versions": [v.name for v in series],
        "files": sorted(series[-1].files), "logical": logical,
        "tensor_bytes": sum(v.tensor_bytes for v in series), "pieces_per_version": len(series[-1].pieces),
        "rest_raw": sum(rest_raw), "rest_stored": sum(rest_stored),
        "cowfs_today": cdc_today(series) / logical, "bits": bit_stats(series),
        "ratios": {}, "categories": {}, "speed": {},
    }
    categories = sorted({p.category for v in series for p in v.pieces})
    res["category_logical"] = {c: sum(p.length for v in series for p in v.pieces if p.category == c)
                               for c in categories}
    coders = {k: c for k, c in all_coders().items() if args.coders == "all" or k in args.coders.split(",")}
    with ThreadPoolExecutor(args.jobs) as pool:
        for cname, coder in coders.items():
            t1 = time.perf_counter()
            sizes = measure_sizes(series, coder, args.transforms, pool)
            lay = schemes.layouts(sizes, KS)
            res["ratios"][cname] = {k: (sum(int(a.sum()) for a in per) + sum(rest_stored)) / logical
                                    for k, per in lay.items()}
            res["categories"][cname] = {
                k: {c: sum(int(a[[p.category == c for p in v.pieces]].sum()) for a, v in zip(per, series))
                    for c in categories}
                for k, per in lay.items() if k in ("whole", "reverse xor K=4", "reverse sub K=4")}
            log(f"  sizes {cname}: {time.perf_counter() - t1:.1f} s, "
                + ", ".join(f"{k} {v:.3f}" for k, v in res["ratios"][cname].items() if k in MAIN_COLUMNS[:3]))
    if args.reps > 0:
        whole_jobs, delta_jobs = jobs_of(series[-1], None), jobs_of(series[-2], series[-1])
        for cname, coder in coders.items():
            res["speed"][cname] = {"whole": measure_speed(whole_jobs, coder, None, args.reps)}
            for t in args.transforms:
                res["speed"][cname][t] = measure_speed(delta_jobs, coder, t, args.reps)
            log(f"  speed {cname}: whole enc {res['speed'][cname]['whole']['enc_1t']}")
    if args.peers:
        res["peers"] = {}
        for tool, out in peers.measure(path, args.work / "peers").items():
            if out is not None:
                out["ratio"] = out["repo_bytes"] / logical
            res["peers"][tool] = out
            log(f"  {tool}: {out}")
    res["seconds"] = round(time.perf_counter() - t0, 1)
    return res


# ---- report -----------------------------------------------------------------------------

def _cell(v: dict[str, float] | None) -> str:
    return "-" if not v else f"{v['median']:.0f} ({v['min']:.0f}-{v['max']:.0f})"


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(r) + " |" for r in rows]


def markdown(res: dict[str, Any]) -> str:
    n = len(res["versions"])
    out = [f"### Series {res['series']}: {n} checkpoints, {res['logical'] / 1e6:.1f} MB logical "
           f"({res['tensor_bytes'] / 1e6:.1f} MB in tensors, {res['pieces_per_version']} pieces per checkpoint)", "",
           "Stored/logical over the whole series (non-tensor rest and dedup included in every cell):", ""]
    rows = [[name] + [f"{r[c]:.3f}" if c in r else "-" for c in MAIN_COLUMNS] for name, r in res["ratios"].items()]
    extra = [["cowfs today (64 KiB CDC dedup, raw)", f"{res['cowfs_today']:.3f}"] + [""] * (len(MAIN_COLUMNS) - 1)]
    for tool, p in (res.get("peers") or {}).items():
        extra.append([f"{tool} ({p['tool']}, {p['settings']})" if p else f"{tool}: not installed",
                      f"{p['ratio']:.3f}" if p else "-"] + [""] * (len(MAIN_COLUMNS) - 1))
    out += _table(["codec"] + MAIN_COLUMNS, rows + extra)
    eng = next(iter(res["ratios"]))
    r = res["ratios"][eng]
    out += ["", f"Layouts with {eng} (n = {n}):", ""]
    lay_rows = [["every version whole", "-", "1", str(n), "0", f"{r['whole']:.3f}"],
                ["forward xor (newest at the end of the chain)", "-", str(n), "1", "0", f"{r['forward xor']:.3f}"]]
    for t in TRANSFORMS:
        for k in KS:
            key = f"reverse {t} K={k or 'inf'}"
            if key in r:
                lay_rows.append([f"reverse {t}", str(k or "none"), str(k or n), str(schemes.wholes(n, k)),
                                 "1", f"{r[key]:.3f}"])
    out += _table(["layout", "keyframe every K", "max pieces per read", "versions whole",
                   "re-encodes per checkpoint", "stored/logical"], lay_rows)
    cats = res["category_logical"]
    out += ["", f"Per file and tensor role with {eng}, stored/logical: whole / reverse xor K=4 / reverse sub K=4:", ""]
    cat_rows = [[c, f"{cats[c] / 1e6:.1f}"] + [" / ".join(
        f"{res['categories'][eng][k][c] / cats[c]:.3f}" for k in ("whole", "reverse xor K=4", "reverse sub K=4")
        if k in res["categories"][eng])] for c in sorted(cats)]
    out += _table(["file:role", "MB", "ratios"], cat_rows)
    out += ["", f"Non-tensor rest: {res['rest_raw'] / 1e6:.2f} MB raw, {res['rest_stored'] / 1e6:.2f} MB stored.",
            "", "Consecutive checkpoints (each against the next newer): share of elements bit-identical; share "
            "of zero XOR bytes, most significant byte first; order-0 entropy of the byte planes / 8 bits "
            "(whole / xor / sub), a rough floor for coders of byte planes without context:", ""]
    for c, s in sorted(res["bits"].items()):
        ent = " / ".join(f"{s[k]:.3f}" for k in ("entropy_whole", "entropy_xor", "entropy_sub") if k in s)
        out.append(f"- {c}: identical {s['identical']:.3f}; zero XOR bytes {s['zero_xor_bytes_msb_first']}"
                   + (f"; entropy {ent}" if ent else ""))
    if res["speed"]:
        out += speed_tables(res["speed"])
    return "\n".join(out)


def speed_tables(speed: dict[str, Any]) -> list[str]:
    sp = next(iter(speed.values()))
    deltas = [t for t in sp if t != "whole"]
    out = ["", f"Throughput, MB/s of checkpoint data (1e6 B), median (min-max) of the reps, on the newest "
           f"checkpoint ({sp['whole']['mb']} MB). 1T: one thread; lib 2T: the library's nthreads=2, one caller; "
           "2 workers: two threads over pieces, library nthreads=1, Blosc2 releasing the GIL "
           "(blosc2.set_releasegil(True)); GIL held: the same with Blosc2's default, which holds it.", ""]
    head = ["codec", "enc 1T", "enc lib 2T", "enc 2 workers", "enc 2 workers, GIL held",
            "dec 1T", "dec lib 2T", "dec 2 workers", "dec 2 workers, GIL held"]
    keys = ("enc_1t", "enc_lib2", "enc_pool2", "enc_pool2_gil", "dec_1t", "dec_lib2", "dec_pool2", "dec_pool2_gil")
    out += _table(head, [[name] + [_cell(s["whole"].get(k)) for k in keys] for name, s in speed.items()])
    if deltas:
        out += ["", "Deltas: the checkpoint before the newest coded against the newest (transform both ways "
                "included; the engine row's xor is cowfs.store.log.codecs.encode_delta, which also codes the piece "
                "whole and keeps the smaller):", ""]
        head = ["codec"] + [f"{t} {k}" for t in deltas for k in ("enc 1T", "enc 2 workers", "dec 1T", "dec 2 workers")]
        head.append("round trip")
        rows = []
        for name, s in speed.items():
            cells = [name] + [_cell(s[t].get(k)) for t in deltas for k in ("enc_1t", "enc_pool2", "dec_1t", "dec_pool2")]
            cells.append("ok" if all(v["roundtrip_ok"] for v in s.values()) else "FAILED")
            rows.append(cells)
        out += _table(head, rows)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.bench.codecs", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, required=True, help="where the series are built and kept (and peer repos)")
    ap.add_argument("--series", default="bf16,fp32", help=f"comma-separated, of {', '.join(seriescache.SERIES)}")
    ap.add_argument("--checkpoints", type=int, default=10)
    ap.add_argument("--piece-kib", type=int, default=1024)
    ap.add_argument("--coders", default="all", help="comma-separated coder names, or 'all'")
    ap.add_argument("--transforms", default="xor,sub", help=f"delta transforms, of {', '.join(TRANSFORMS)}")
    ap.add_argument("--reps", type=int, default=5, help="timing repetitions (0: no timing)")
    ap.add_argument("--jobs", type=int, default=2, help="threads for the size passes")
    ap.add_argument("--peers", action="store_true", help="also store each series in restic and borg")
    ap.add_argument("--md", type=Path)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    args.transforms = [t for t in args.transforms.split(",") if t]
    args.work.mkdir(parents=True, exist_ok=True)
    blosc2.set_releasegil(True)  # as the engine's worker threads need it; measure_speed also times it held
    env = {"machine": f"{os.cpu_count()} CPUs", "load_at_start": os.getloadavg(), "blosc2": blosc2.__version__,
           "numpy": np.__version__, "argv": sys.argv[1:]}
    results = []
    for name in args.series.split(","):
        path = seriescache.ensure(args.work, name, args.checkpoints)
        results.append(run_series(name, path, args))
    env["load_at_end"] = os.getloadavg()
    md = "\n\n".join(markdown(r) for r in results)
    print(md)
    if args.md:
        args.md.write_text(md + "\n")
    if args.json:
        args.json.write_text(json.dumps({"env": env, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
