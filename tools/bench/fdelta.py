"""The float delta codec (issue 36, codec 4) against the engine without it, on a real Trainer
series: what the store keeps, how fast compaction runs, how fast every checkpoint reads,
and each codec's speed on its own.

    python -m tools.bench.fdelta --work /var/tmp/cowfs-fdelta --series bf16,fp32 --reps 3

For each series (tools/bench/seriescache.py, built under --work unless there) and each
repetition, two arms in alternating order, each a new store (Store API, no mount: the
codec alone, without FUSE's costs on the way in): every checkpoint's files written in
training order, then `compact` + `gc` (timed), stats, every file read back and compared;
then the store mounted and every checkpoint read cold through the mount (4 MiB reads,
page cache dropped before each, --read-reps times, as the compaction benchmark reads).
Arms:

* **before**: the engine as it was (codec 4 switched off: `FLOAT_FORMATS` emptied in this
  process, so every float piece takes the subtraction delta or stays whole);
* **fdelta**: the engine as it is.

Then, per codec on one thread, over every float piece of every checkpoint but the newest
(against the same piece one checkpoint newer): bytes, encode and decode MB/s (median of
--codec-reps), per tensor role.

A bench tool: cowfs/ never imports it; no torch.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from cowfs import _native
from cowfs.store import Store
from cowfs.store.log import codecs
from cowfs.store.tensors.formats import TensorRegion

from . import seriescache
from .compaction import cold_reads
from .mounting import mounted
from .pieces import OPTIMIZER_ROLES, Version, base_index, file_regions, load_series, version_dirs

ARMS = ("before", "fdelta")


def write_series(store: Store, series_dir: Path) -> dict[str, bytes]:
    """Every checkpoint's files, in order; path -> bytes."""
    files: dict[str, bytes] = {}
    for vdir in version_dirs(series_dir):
        store.mkdir(1, vdir.name.encode())
        for f in sorted(vdir.iterdir()):
            if f.is_file():
                data = f.read_bytes()
                store.write_file(f"/{vdir.name}/{f.name}", data)
                files[f"/{vdir.name}/{f.name}"] = data
    return files


def role_of(path: str, regions: list[TensorRegion], offset: int) -> str:
    """'model.safetensors:param', 'optimizer.pt:exp_avg', ... for a tensor's bytes, else
    'FILE:rest' (headers, pickles, small files), as pieces.Piece.category names them."""
    name = path.rsplit("/", 1)[-1]
    for r in regions:
        if r.offset <= offset < r.offset + r.length:
            last = r.name.rsplit(".", 1)[-1]
            role = last if last in OPTIMIZER_ROLES else ("param" if name.endswith(".safetensors") else "other")
            return f"{name}:{role}"
    return f"{name}:rest"


def stored_by_role(store: Store, files: dict[str, bytes], newest: str) -> dict[str, int]:
    """Stored bytes per tensor role, each chunk counted once, where it first appears in
    training order; the newest checkpoint's own chunks under 'newest'."""
    seen: set[int] = set()
    out: dict[str, int] = {}
    for path, data in files.items():
        vid = store.resolve(path).vid
        rows = store.catalog.read(lambda conn: conn.execute(
            "SELECT e.file_offset, c.cid, c.stored_len FROM versions v JOIN extents e ON e.content_id = v.content_id"
            " JOIN chunks c ON c.cid = e.cid WHERE v.vid = ?", (vid,)).fetchall())
        regions = file_regions(data, path.rsplit("/", 1)[-1])
        for offset, cid, stored in rows:
            if cid in seen:
                continue
            seen.add(cid)
            role = "newest" if path.startswith(f"/{newest}/") else role_of(path, regions, offset)
            out[role] = out.get(role, 0) + stored
    return out


def run_arm(arm: str, series_dir: Path, work: Path, read_reps: int) -> dict[str, Any]:
    saved = dict(codecs.FLOAT_FORMATS)
    if arm == "before":
        codecs.FLOAT_FORMATS.clear()
    root = work / f"store-{arm}"
    shutil.rmtree(root, ignore_errors=True)
    try:
        Store.init(root, device="file")
        with Store.open(root) as store:
            files = write_series(store, series_dir)
            t0 = time.monotonic()
            report = store.compact()
            store.gc()
            compact_s = time.monotonic() - t0
            stats = store.stats()
            by_role = stored_by_role(store, files, version_dirs(series_dir)[-1].name)
            for path, data in files.items():
                if store.read_file(path) != data:
                    raise SystemExit(f"fdelta bench: {path} reads back other bytes ({arm})")
        names = [v.name for v in version_dirs(series_dir)]
        with mounted(root, work / f"mnt-{arm}") as m:
            cold = cold_reads(m, {name: name for name in names}, read_reps)
        ck_bytes = {name: cold[name]["bytes"] for name in names}
        reads = {name: cold[name]["seconds"] for name in names}
        logical = sum(len(d) for d in files.values())
        return {
            "arm": arm, "logical": logical, "stored": stats["stored_bytes"],
            "ratio": stats["stored_bytes"] / logical, "compact_s": compact_s,
            "compact_MBps": logical / compact_s / 1e6, "deltas": report.deltas,
            "codecs": {c: v["chunks"] for c, v in stats["codecs"].items()},
            "read_MBps": {name: ck_bytes[name] / statistics.median(ts) / 1e6 for name, ts in reads.items()},
            "caches_dropped": cold["caches_dropped"], "stored_by_role": by_role,
        }
    finally:
        codecs.FLOAT_FORMATS.update(saved)
        shutil.rmtree(root, ignore_errors=True)


def codec_speeds(series: list[Version], reps: int) -> dict[str, Any]:
    """Per tensor role: bytes and one-thread speeds of codec 3 (sub) and codec 4 (fdelta)."""
    out: dict[str, dict[str, float]] = {}
    for vi, version in enumerate(series[:-1]):
        newer = series[vi + 1]
        for i, j in enumerate(base_index(version, newer)):
            p = version.pieces[i]
            if j is None or p.dtype not in codecs.FLOAT_FORMATS or p.length < 4096:
                continue
            raw, base = version.view(p), newer.view(newer.pieces[j])
            fmt = codecs.FLOAT_FORMATS[p.dtype]
            cell = out.setdefault(p.category, {})
            cell["logical"] = cell.get("logical", 0) + p.length
            dest = bytearray(p.length)
            sizes = {}
            for name in ("sub", "fdelta"):
                enc_t, dec_t = [], []
                for _ in range(reps):
                    t = time.perf_counter()
                    if name == "fdelta":
                        payload = _native.fdelta_encode(raw, base, *fmt, 1 << 30, codecs.FDELTA_LANES[codecs.FDELTA_WRITTEN])
                    else:
                        payload = codecs._grouped(codecs.sub_bytes(raw, base, fmt[0]), fmt[0])
                    enc_t.append(time.perf_counter() - t)
                    t = time.perf_counter()
                    if name == "fdelta":
                        _native.fdelta_decode(payload, base, dest, codecs.FDELTA_LANES[codecs.FDELTA_WRITTEN])
                    else:
                        codecs.decode_into(codecs.CODEC_SUB, b"\0" * 32 + payload, memoryview(dest), lambda _h: base)
                    dec_t.append(time.perf_counter() - t)
                if bytes(dest) != bytes(raw):
                    raise SystemExit(f"fdelta bench: {name} does not round-trip {p.tensor}")
                cell[name] = cell.get(name, 0) + len(payload) + 32
                sizes[name] = len(payload)
                cell[f"{name} enc s"] = cell.get(f"{name} enc s", 0) + statistics.median(enc_t)
                cell[f"{name} dec s"] = cell.get(f"{name} dec s", 0) + statistics.median(dec_t)
                cell[f"{name} pieces"] = cell.get(f"{name} pieces", 0) + 1
            # codec 3 smaller than a codec 4 of at most FDELTA_SURE, which the engine keeps without trying it
            if sizes["fdelta"] <= p.length * codecs.FDELTA_SURE and sizes["sub"] < sizes["fdelta"]:
                cell["sure lost"] = cell.get("sure lost", 0) + sizes["fdelta"] - sizes["sub"]
    return {role: {"logical": c["logical"], "sure lost": c.get("sure lost", 0),
                   **{f"{n} ratio": c[n] / c["logical"] for n in ("sub", "fdelta")},
                   **{f"{n} enc MB/s": c["logical"] / c[f"{n} enc s"] / 1e6 for n in ("sub", "fdelta")},
                   **{f"{n} dec MB/s": c["logical"] / c[f"{n} dec s"] / 1e6 for n in ("sub", "fdelta")}}
            for role, c in out.items()}


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} [{min(values):.3f}-{max(values):.3f}]"


def markdown(name: str, runs: list[dict[str, Any]], speeds: dict[str, Any]) -> str:
    lines = [f"Series {name}: {len(runs) // 2} repetitions per arm, median [min-max]\n",
             "| arm | stored / logical | compaction MB/s | newest read MB/s | oldest read MB/s"
             " | slowest read / newest | records |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for arm in ARMS:
        mine = [r for r in runs if r["arm"] == arm]
        names = list(mine[0]["read_MBps"])
        lines.append(f"| {arm} | {spread([r['ratio'] for r in mine])} | {spread([r['compact_MBps'] for r in mine])}"
                     f" | {spread([r['read_MBps'][names[-1]] for r in mine])}"
                     f" | {spread([r['read_MBps'][names[0]] for r in mine])}"
                     f" | {spread([min(r['read_MBps'].values()) / r['read_MBps'][names[-1]] for r in mine])}"
                     f" | {', '.join(f'{c} {n}' for c, n in sorted(mine[0]['codecs'].items()))} |")
    roles = sorted({k for r in runs for k in r["stored_by_role"]})
    lines += ["", "Stored bytes by tensor role, as a share of the series' logical bytes (first run of each arm;"
              " 'newest': the newest checkpoint's own records, raw):", "",
              "| role | " + " | ".join(ARMS) + " |", "| --- |" + " --- |" * len(ARMS)]
    first = {arm: next(r for r in runs if r["arm"] == arm) for arm in ARMS}
    for role in roles:
        lines.append(f"| {role} | " + " | ".join(f"{first[a]['stored_by_role'].get(role, 0) / first[a]['logical']:.4f}"
                                                for a in ARMS) + " |")
    lines += ["", "Each codec alone, one thread, every float piece of every checkpoint but the newest against the"
              " next newer (stored / logical; 'lost': bytes codec 3 would have saved where the engine keeps"
              f" a codec 4 of at most {codecs.FDELTA_SURE} without trying codec 3):", "",
              "| tensor role | MB | sub | fdelta | sub enc MB/s | fdelta enc MB/s | sub dec MB/s | fdelta dec MB/s"
              " | lost |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for role, c in sorted(speeds.items()):
        lines.append(f"| {role} | {c['logical'] / 1e6:.1f} | {c['sub ratio']:.3f} | {c['fdelta ratio']:.3f}"
                     f" | {c['sub enc MB/s']:.0f} | {c['fdelta enc MB/s']:.0f} | {c['sub dec MB/s']:.0f}"
                     f" | {c['fdelta dec MB/s']:.0f} | {c['sure lost']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.bench.fdelta", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, required=True, help="where the series are built and kept, and the stores made")
    ap.add_argument("--series", default="bf16,fp32", help=f"comma-separated, of {', '.join(seriescache.SERIES)}")
    ap.add_argument("--series-dir", type=Path, action="append", default=[],
                    help="a series directory to use as it is (another optimizer's run), besides --series")
    ap.add_argument("--reps", type=int, default=3, help="repetitions per arm")
    ap.add_argument("--codec-reps", type=int, default=3, help="timings per piece and codec")
    ap.add_argument("--read-reps", type=int, default=3, help="cold reads of every checkpoint per run")
    ap.add_argument("--md", type=Path)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if args.reps < 1 or args.codec_reps < 1:
        ap.error("--reps and --codec-reps must be 1 or more")
    args.work.mkdir(parents=True, exist_ok=True)
    text, results = [], []
    dirs = []
    for name in [s for s in args.series.split(",") if s]:
        if name not in seriescache.SERIES:
            ap.error(f"unknown series {name!r}, not one of {', '.join(seriescache.SERIES)}")
        dirs.append((name, None))
    for d in args.series_dir:
        if not d.is_dir() or len(version_dirs(d)) < 2:
            ap.error(f"{d}: not a series directory of two or more checkpoints")
        dirs.append((d.name, d))
    for name, given in dirs:
        series_dir = given if given is not None else seriescache.ensure(args.work, name)
        runs = []
        for rep in range(args.reps):
            for arm in (ARMS if rep % 2 == 0 else ARMS[::-1]):
                runs.append(run_arm(arm, series_dir, args.work, args.read_reps))
                print(f"{name} {arm}: {runs[-1]['ratio']:.4f} in {runs[-1]['compact_s']:.1f} s", file=sys.stderr)
        speeds = codec_speeds(load_series(series_dir, 1 << 20), args.codec_reps)
        text.append(markdown(name, runs, speeds))
        results.append({"series": name, "runs": runs, "codecs": speeds})
    print("\n".join(text))
    if args.md:
        args.md.write_text("\n".join(text))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
