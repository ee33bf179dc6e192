"""What context-modelled coding of float pieces could store (issue 36), against the engine's
codecs, on a real Trainer series: the study that chooses the codec's models.

    python -m tools.bench.ctxmodel --work /var/tmp/cowfs-codecs --series bf16,fp32

Each series (tools/bench/seriescache.py; built under --work unless there) is cut as the
engine cuts it (tools/bench/pieces.py). Every float tensor piece of every version but the
newest is priced:

* engine: the engine's own codecs (cowfs.store.log.codecs): `encode_whole`, and
  `encode_delta` against the same piece of the next newer version, exact sizes;
* models: the bits a static per-piece table of a conditional model needs, summed over
  the piece's elements (the empirical conditional entropy, which a table-driven rANS
  reaches within a fraction of a percent), plus the table itself at TABLE_BITS per used
  cell. A float is split into sign, exponent, the top 7 mantissa bits, and (fp32) 16
  low mantissa bits, stored as they are. Models:
    whole order 0      sign+exponent as one symbol, top mantissa | exponent;
    whole given v      for exp_avg: sign+exponent | the exponent of the same element of
                       exp_avg_sq in the same version (|m| <= 7.27 sqrt(v) for AdamW);
    whole given newer  sign+exponent | sign+exponent of the same element one version newer;
    delta given newer  d = x - newer as integers of the element size, zigzag; its bit length
                       | (newer's exponent, the bit length of the element before), then
                       the bits below the leading one as they are;
    delta value        d as above, but z itself is the symbol when below VALUE_ESCAPE (an
      given newer      escape symbol, then the bit length and the bits below its leading one,
                       as above, for the rest) | (newer's exponent, the bit length of the
                       element before, both capped): the exact small differences and the
                       runs of unchanged elements (z = 0 after z = 0) that Blosc2's LZ stage
                       takes whole and the bit-length model prices bit by bit;
    whole given m      for exp_avg_sq: sign+exponent | the exponent of exp_avg (the bound
                       read the other way); priced per piece only: a layout cannot code m
                       given v and v given m at once, and the layouts below use m given v.
  Each model is priced twice: with static tables (above), and "adaptive", as an adaptive
  coder pays: counts that start at 1/2 per symbol of the piece's alphabet and grow as it
  codes (the Krichevsky-Trofimov estimator, whose code length per context is a ratio of
  Gamma functions, so it is exact without coding anything), no table stored, the alphabet
  named by one bit per possible symbol.
Layout (the rule of tools/bench/schemes.py's `reverse`): the engine's reverse chain with a keyframe every K
(a keyframe may use the order-0 and `given v` models, never a newer version); the newest is
stored raw, as the compactor keeps it. A piece's cost is the smallest model allowed at its
place, or nothing where the same bytes are stored with a newer piece (global dedup, as
`pieces.duplicates` finds it). The non-float rest (configs, scheduler and RNG state, the pickles around the
tensors, the scalar `step` tensors: a few KB per version) is priced at its logical size, so
the series ratio is an upper bound. No timing: the coder's speed is measured where it is
built.

A bench tool: cowfs/ never imports it; no torch.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

from cowfs.store.log.codecs import DELTA_MAX_SHARE, encode_delta, encode_whole

from . import seriescache
from .pieces import Piece, Version, base_index, duplicates, load_series

TABLE_BITS = 24  # a used (context, symbol) cell of a static table: the symbol and a 12-bit frequency, sparse
FLOAT_DTYPES = {"BF16": (2, 8, 7, 0), "F16": (2, 5, 7, 3), "F32": (4, 8, 7, 16)}  # bytes, exp bits, modelled mantissa, raw bits
ID_BYTES = 32  # a delta names its base
PRICED = ("engine whole", "engine delta", "whole order 0", "whole given v", "whole given m", "whole given newer",
          "delta given newer", "delta value given newer")
VALUE_ESCAPE = 64  # "delta value given newer": zigzag differences below this are symbols of their own  # each context model also as "... adaptive"
_LGAMMA = np.frompyfunc(math.lgamma, 1, 1)


def ints(buf: memoryview, size: int) -> np.ndarray:
    return np.frombuffer(buf, np.uint16 if size == 2 else np.uint32).astype(np.int64)


def fields(x: np.ndarray, dtype: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sign+exponent, top mantissa, exponent) of integer images."""
    size, ebits, mbits, raw = FLOAT_DTYPES[dtype]
    total = size * 8
    mant = total - 1 - ebits
    e = (x >> mant) & ((1 << ebits) - 1)
    se = (x >> mant) & ((1 << (ebits + 1)) - 1)
    top = (x >> (mant - mbits)) & ((1 << mbits) - 1)
    return se, top, e


def cond_bits(sym: np.ndarray, ctx: np.ndarray | None = None) -> float:
    """Bits to code `sym` with a static table per context value, the table included."""
    k = int(sym.max()) + 1
    cells = np.bincount(sym if ctx is None else ctx * k + sym).astype(np.float64)
    cells = np.pad(cells, (0, -cells.size % k)).reshape(-1, k)
    totals = cells.sum(1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        bits = np.where(cells > 0, cells * np.log2(totals / cells), 0.0).sum()
    return float(bits) + int((cells > 0).sum()) * TABLE_BITS


def adaptive_bits(sym: np.ndarray, ctx: np.ndarray | None = None) -> float:
    """Bits an adaptive coder pays for `sym`, counts per context value starting at 1/2 for
    each symbol of the piece's alphabet (Krichevsky-Trofimov): per context with counts n_s
    (n in all, k symbols), log2 of Gamma(n + k/2) Gamma(1/2)^k / (Gamma(k/2) prod Gamma(n_s + 1/2)),
    which does not depend on the order; plus one bit per possible symbol to name the alphabet."""
    k = int(sym.max()) + 1
    cells = np.bincount(sym if ctx is None else ctx * k + sym)
    cells = np.pad(cells, (0, -cells.size % k)).reshape(-1, k)
    cells = cells[cells.sum(1) > 0][:, cells.sum(0) > 0].astype(np.float64)
    alphabet = cells.shape[1]

    def lg(a: np.ndarray | float) -> float:
        return float(np.asarray(_LGAMMA(np.asarray(a, dtype=np.float64)), dtype=np.float64).sum())

    n = cells.sum(1)
    nats = (lg(n + alphabet / 2) - len(n) * math.lgamma(alphabet / 2)
            - lg(cells + 0.5) + cells.size * math.lgamma(0.5))
    return nats / math.log(2) + k


def whole_bits(x: np.ndarray, dtype: str, ctx_se: np.ndarray | None, adaptive: bool = False) -> float:
    se, top, e = fields(x, dtype)
    raw = FLOAT_DTYPES[dtype][3] * x.size
    bits = adaptive_bits if adaptive else cond_bits
    return bits(se, ctx_se) + bits(top, e) + raw


def delta_bits(x: np.ndarray, newer: np.ndarray, dtype: str, adaptive: bool = False) -> float:
    """d = x - newer, zigzag z: its bit length | (newer's exponent, the bit length of the
    element before), then the bits below the leading one as they are."""
    d = x - newer
    z = np.where(d >= 0, 2 * d, -2 * d - 1)
    length = np.zeros_like(z)
    nz = z > 0
    length[nz] = np.floor(np.log2(z[nz])).astype(np.int64) + 1
    below = float(np.maximum(length - 1, 0).sum())
    _, _, e = fields(newer, dtype)
    before = np.concatenate([[0], length[:-1]])
    return (adaptive_bits if adaptive else cond_bits)(length, np.clip(e - int(e.min()), 0, 31) * 33 + before) + below


def delta_value_bits(x: np.ndarray, newer: np.ndarray, dtype: str, adaptive: bool = False) -> float:
    """d = x - newer, zigzag z: z as a symbol of its own below VALUE_ESCAPE, else the escape
    and then its bit length (one symbol, order 0) and the bits below its leading one; the
    symbol | (newer's exponent, capped at 15 above the piece's least, and the bit length of
    the element before, capped at 7)."""
    d = x - newer
    z = np.where(d >= 0, 2 * d, -2 * d - 1)
    length = np.zeros_like(z)
    nz = z > 0
    length[nz] = np.floor(np.log2(z[nz])).astype(np.int64) + 1
    big = z >= VALUE_ESCAPE
    sym = np.where(big, VALUE_ESCAPE, z)
    _, _, e = fields(newer, dtype)
    before = np.minimum(np.concatenate([[0], length[:-1]]), 7)
    bits = adaptive_bits if adaptive else cond_bits
    cost = bits(sym, np.clip(e - int(e.min()), 0, 15) * 8 + before)
    if big.any():
        cost += bits(length[big]) + float((length[big] - 1).sum())
    return cost


def piece_costs(series: list[Version]) -> dict[str, Any]:
    """Per version (but the newest) and float piece: bytes under each model (None: not allowed)."""
    out: list[list[dict[str, Any]]] = []
    dup = duplicates(series)  # the engine stores the same bytes once, with their newest copy
    for vi, version in enumerate(series[:-1]):
        newer = series[vi + 1]
        at_newer = base_index(version, newer)
        by_tensor = {(p.file, p.tensor, p.index): i for i, p in enumerate(version.pieces)}
        rows = []
        for i, p in enumerate(version.pieces):
            if p.dtype not in FLOAT_DTYPES or p.length < 4096:
                continue
            size = FLOAT_DTYPES[p.dtype][0]
            raw = version.view(p)
            x = ints(raw, size)
            whole = encode_whole(raw, size).stored_len
            row: dict[str, Any] = {"category": p.category, "logical": p.length, "engine whole": whole,
                                   "dup": dup[vi][i]}
            for suffix, adaptive in (("", False), (" adaptive", True)):
                row["whole order 0" + suffix] = whole_bits(x, p.dtype, None, adaptive) / 8
            partner = _partner(p, by_tensor, version)
            if partner is not None:
                other = fields(ints(version.view(partner), size), p.dtype)[2]
                model = "whole given v" if p.tensor.endswith(".exp_avg") else "whole given m"
                for suffix, adaptive in (("", False), (" adaptive", True)):
                    row[model + suffix] = whole_bits(x, p.dtype, other, adaptive) / 8 + ID_BYTES
            j = at_newer[i]
            if j is not None:
                base = newer.view(newer.pieces[j])
                y = ints(base, size)
                d = encode_delta(raw, size, b"\0" * ID_BYTES, base, 1 << 62)  # always made: priced even where
                row["engine delta"] = d.stored_len if d is not None else None  # the engine would keep it whole
                for suffix, adaptive in (("", False), (" adaptive", True)):
                    row["whole given newer" + suffix] = whole_bits(x, p.dtype, fields(y, p.dtype)[0], adaptive) / 8 + ID_BYTES
                    row["delta given newer" + suffix] = delta_bits(x, y, p.dtype, adaptive) / 8 + ID_BYTES
                    row["delta value given newer" + suffix] = delta_value_bits(x, y, p.dtype, adaptive) / 8 + ID_BYTES
            row["key"] = list(_key(p))
            rows.append(row)
        out.append(rows)
    return {"versions": [v.name for v in series], "pieces": out}


def _partner(p: Piece, by_tensor: dict[tuple[str, str, int], int], version: Version) -> Piece | None:
    """The same piece of the related moment in the same version: exp_avg_sq for exp_avg, and
    exp_avg for exp_avg_sq (torch.save's optimizer state names), if it has the same length."""
    if p.tensor.endswith(".exp_avg"):
        name = p.tensor + "_sq"
    elif p.tensor.endswith(".exp_avg_sq"):
        name = p.tensor[:-len("_sq")]
    else:
        return None
    i = by_tensor.get((p.file, name, p.index))
    other = None if i is None else version.pieces[i]
    return other if other is not None and other.length == p.length else None


def _key(p: Piece) -> tuple[str, str, int]:
    return (p.file, p.tensor, p.index)


def layout(costs: dict[str, Any], k: int, context: bool, adaptive: bool = False) -> dict[str, float]:
    """Stored bytes per category in the reverse chain with a keyframe every k versions
    (version v is a keyframe when v % k == k-1; the newest is raw and not counted here).
    `context`: the context models may be chosen too; `adaptive`: their adaptive prices also."""
    totals: dict[str, float] = {}
    suffixes = ("", " adaptive") if adaptive else ("",)
    for vi, rows in enumerate(costs["pieces"]):
        keyframe = k > 0 and vi % k == k - 1
        for row in rows:
            whole = [row["engine whole"]]
            engine_delta = row.get("engine delta")  # kept by the engine only where it saves a tenth
            delta = [engine_delta if engine_delta is not None and engine_delta <= DELTA_MAX_SHARE * row["engine whole"] else None]
            if context:
                for s in suffixes:
                    whole += [row.get("whole order 0" + s), row.get("whole given v" + s)]
                    delta += [row.get("whole given newer" + s), row.get("delta given newer" + s),
                              row.get("delta value given newer" + s)]
            allowed = whole + ([] if keyframe else delta)
            cost = 0 if row.get("dup") else min(c for c in allowed if c is not None)
            totals[row["category"]] = totals.get(row["category"], 0.0) + cost
            totals["logical " + row["category"]] = totals.get("logical " + row["category"], 0.0) + row["logical"]
    return totals


LAYOUTS = (("engine", False, False), ("context", True, False), ("context, adaptive", True, True))


def report(name: str, series: list[Version], costs: dict[str, Any], k: int) -> dict[str, Any]:
    newest = series[-1]
    logical = sum(v.logical for v in series)
    float_logical = sum(r["logical"] for rows in costs["pieces"] for r in rows)
    other = logical - float_logical - newest.logical  # every byte not priced above, at its logical size
    out: dict[str, Any] = {"series": name, "versions": len(series), "logical": logical, "k": k}
    for label, context, adaptive in LAYOUTS:
        t = layout(costs, k, context, adaptive)
        stored_float = sum(v for c, v in t.items() if not c.startswith("logical "))
        out[label] = {
            "by_category": {c: round(v / t["logical " + c], 4) for c, v in t.items() if not c.startswith("logical ")},
            "older_float_ratio": round(stored_float / float_logical, 4),
            "series_ratio_bound": round((stored_float + newest.logical + other) / logical, 4),
        }
    per_model: dict[str, dict[str, float]] = {}
    for rows in costs["pieces"]:
        for r in rows:
            for m in _priced():
                if r.get(m) is not None:
                    cell = per_model.setdefault(r["category"], {}).setdefault(m, 0.0)
                    per_model[r["category"]][m] = cell + r[m]
                    per_model[r["category"]]["logical " + m] = per_model[r["category"]].get("logical " + m, 0.0) + r["logical"]
    out["per_model"] = {c: {m: round(v / d["logical " + m], 4) for m, v in d.items() if not m.startswith("logical ")}
                        for c, d in per_model.items()}
    return out


def _priced() -> list[str]:
    return [m + s for m in PRICED for s in (("",) if m.startswith("engine") else ("", " adaptive"))]


def markdown(results: list[dict[str, Any]]) -> str:
    lines = []
    for r in results:
        lines.append(f"Series {r['series']} ({r['versions']} versions, {r['logical'] / 1e6:.1f} MB), "
                     f"reverse chain with a keyframe every {r['k']}, newest raw:\n")
        cats = sorted(r["per_model"])
        lines.append("| model | " + " | ".join(cats) + " |")
        lines.append("|---" * (len(cats) + 1) + "|")
        for m in _priced():
            if any(m in r["per_model"][c] for c in cats):
                lines.append(f"| {m} | " + " | ".join(f"{r['per_model'][c][m]:.3f}" if m in r["per_model"][c] else "-"
                                                      for c in cats) + " |")
        lines.append("")
        lines.append("| layout | " + " | ".join(cats) + " | older float pieces | series (bound) |")
        lines.append("|---" * (len(cats) + 3) + "|")
        for label, _, _ in LAYOUTS:
            e = r[label]
            lines.append(f"| {label} | " + " | ".join(f"{e['by_category'].get(c, float('nan')):.3f}" for c in cats)
                         + f" | {e['older_float_ratio']:.3f} | {e['series_ratio_bound']:.3f} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.bench.ctxmodel", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, required=True, help="where the series are built and kept")
    ap.add_argument("--series", default="bf16,fp32", help=f"comma-separated, of {', '.join(seriescache.SERIES)}")
    ap.add_argument("--series-dir", type=Path, action="append", default=[],
                    help="a series directory to study as it is (instead of --series)")
    ap.add_argument("--checkpoints", type=int, default=10)
    ap.add_argument("--keyframe", type=int, default=4, help="K of the reverse chain (0: no keyframes)")
    ap.add_argument("--md", type=Path)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if args.keyframe < 0:
        ap.error("--keyframe must be 0 or more")
    dirs = args.series_dir or [seriescache.ensure(args.work, s, args.checkpoints) for s in args.series.split(",") if s]
    results = []
    for d in dirs:
        series = load_series(d, 1 << 20)
        if len(series) < 2:
            print(f"ctxmodel: {d}: fewer than two versions", file=sys.stderr)
            return 2
        results.append(report(d.name, series, piece_costs(series), args.keyframe))
    text = markdown(results)
    print(text)
    if args.md:
        args.md.write_text(text)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
