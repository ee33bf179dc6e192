"""The measurements behind tools/bench/codecs.py: piece sizes for every coder and transform,
the cost of the non-tensor rest, and encode/decode throughput.

A bench tool: cowfs/ never imports it.
"""
from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import blosc2
import numpy as np

from cowfs.store.data.chunking import chunk_id
from cowfs.store.log import codecs as engine

from .codeclib import TRANSFORMS, Coder, Transform, stored_size
from .pieces import Piece, Version, base_index, duplicates
from .schemes import Sizes

Job = tuple[Piece, np.ndarray, np.ndarray | None]  # a piece, its bytes, its base's bytes (or None)


def u8(mv: memoryview) -> np.ndarray:
    return np.frombuffer(mv, np.uint8)


def jobs_of(target: Version, base: Version | None) -> list[Job]:
    if base is None:
        return [(p, u8(target.view(p)), None) for p in target.pieces]
    where = base_index(target, base)
    return [(p, u8(target.view(p)), None if b is None else u8(base.view(base.pieces[b])))
            for p, b in zip(target.pieces, where)]


def rest_cost(series: list[Version]) -> tuple[list[int], list[int]]:
    """Per version: raw bytes of its non-tensor chunks, and what they cost stored by the
    engine (chunks deduplicated by BLAKE3 id across the series, each encode_whole'd with
    element size 1). The same for every tensor codec."""
    seen: set[bytes] = set()
    raw, stored = [], []
    for v in series:
        raw.append(sum(len(c) for c in v.rest))
        cost = 0
        for c in v.rest:
            cid = chunk_id(c)
            if cid not in seen:
                seen.add(cid)
                cost += engine.encode_whole(c, 1).stored_len
        stored.append(cost)
    return raw, stored


def _cost(coder: Coder, transform: Transform | None, job: Job) -> int:
    p, data, base = job
    if transform is None or base is None:
        return stored_size(coder.encode(data, p.elem_size), p.length)
    resid = transform.forward(data, base, p.elem_size)
    return engine.ID_SIZE + stored_size(coder.encode(resid, p.elem_size), p.length)


def measure_sizes(series: list[Version], coder: Coder, transforms: list[str], pool: ThreadPoolExecutor) -> Sizes:
    """Every piece of every version coded whole, and (each transform) against the same
    piece of the next newer version."""
    coder.set_threads(1)

    def run(jobs: list[Job], t: Transform | None) -> np.ndarray:
        return np.fromiter(pool.map(lambda j: _cost(coder, t, j), jobs), np.int64, len(jobs))

    whole = [run(jobs_of(v, None), None) for v in series]
    delta: dict[str, list[np.ndarray]] = {}
    for name in transforms:
        delta[name] = []
        for v in range(len(series) - 1):
            d = run(jobs_of(series[v], series[v + 1]), TRANSFORMS[name])
            no_base = np.array([b is None for b in base_index(series[v], series[v + 1])], bool)
            delta[name].append(np.where(no_base, whole[v], d))
    dup = [np.array(f, bool) for f in duplicates(series)]
    fmap = [np.zeros(0, np.int64)]
    for v in range(1, len(series)):
        fmap.append(np.array([-1 if b is None else b for b in base_index(series[v], series[v - 1])], np.int64))
    return Sizes(whole, delta, dup, fmap)


# ---- throughput -------------------------------------------------------------------------

def _rates(nbytes: int, times: list[float]) -> dict[str, float]:
    r = sorted(nbytes / t / 1e6 for t in times)
    return {"min": round(r[0], 1), "median": round(statistics.median(r), 1), "max": round(r[-1], 1)}


def _timed(fn: Callable[[], object], reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def _codec_fns(coder: Coder, transform: str | None) -> tuple[Callable[[Job], Any], Callable[[Job, Any], np.ndarray]]:
    """encode(job) -> blob and decode(job, blob) -> piece, whole or (transform) as a delta
    against the job's base; the engine's XOR delta is its own encode_delta/decode."""
    if transform is None:
        return (lambda j: coder.encode(j[1], j[0].elem_size),
                lambda j, b: coder.decode(b, j[0].elem_size, j[0].length))
    if transform == "xor" and coder.encode_delta is not None and coder.decode_delta is not None:
        ed, dd = coder.encode_delta, coder.decode_delta
        return (lambda j: ed(j[1], j[0].elem_size, j[2]),
                lambda j, b: dd(b[0], b[1], j[0].elem_size, j[0].length, j[2]))
    t = TRANSFORMS[transform]
    return (lambda j: coder.encode(t.forward(j[1], j[2], j[0].elem_size), j[0].elem_size),
            lambda j, b: t.inverse(coder.decode(b, j[0].elem_size, j[0].length), j[2], j[0].elem_size))


def measure_speed(jobs: list[Job], coder: Coder, transform: str | None, reps: int) -> dict[str, Any]:
    """MB/s (1e6 bytes of piece data) encoding and decoding `jobs` (whole, or as `transform`
    deltas, the transform both ways included; the base is in memory): one thread; the
    library's own nthreads=2 (one caller); two worker threads over pieces (library
    nthreads=1), and for Blosc2 the same with the GIL held during (de)compression, which is
    Blosc2's default (the benchmark runs with blosc2.set_releasegil(True) otherwise).
    Checks the round trip."""
    if transform is not None:
        jobs = [j for j in jobs if j[2] is not None]
    nbytes = sum(j[0].length for j in jobs)
    enc, dec = _codec_fns(coder, transform)
    coder.set_threads(1)
    blobs = [enc(j) for j in jobs]
    ok = all(np.array_equal(dec(j, b), j[1]) for j, b in zip(jobs, blobs))
    pairs = list(zip(jobs, blobs))
    res: dict[str, Any] = {"mb": round(nbytes / 1e6, 1), "roundtrip_ok": ok}
    res["enc_1t"] = _rates(nbytes, _timed(lambda: [enc(j) for j in jobs], reps))
    res["dec_1t"] = _rates(nbytes, _timed(lambda: [dec(j, b) for j, b in pairs], reps))
    if coder.lib_threads:
        coder.set_threads(2)
        res["enc_lib2"] = _rates(nbytes, _timed(lambda: [enc(j) for j in jobs], reps))
        res["dec_lib2"] = _rates(nbytes, _timed(lambda: [dec(j, b) for j, b in pairs], reps))
        coder.set_threads(1)
    modes = [("", True)] + ([("_gil", False)] if coder.blosc2 else [])
    with ThreadPoolExecutor(2) as pool:
        for suffix, release in modes:
            previous = blosc2.set_releasegil(release)
            try:
                res["enc_pool2" + suffix] = _rates(nbytes, _timed(lambda: list(pool.map(enc, jobs)), reps))
                res["dec_pool2" + suffix] = _rates(
                    nbytes, _timed(lambda: list(pool.map(lambda jb: dec(*jb), pairs)), reps))
            finally:
                blosc2.set_releasegil(previous)
    return res


def _plane_entropy_bits(hists: np.ndarray) -> float:
    """Total order-0 entropy (bits) of byte planes given their byte histograms (planes x 256)."""
    total = 0.0
    for h in hists:
        n = h.sum()
        if n:
            pr = h[h > 0] / n
            total += float(-(pr * np.log2(pr)).sum()) * n
    return total


def bit_stats(series: list[Version]) -> dict[str, dict[str, Any]]:
    """Per category over consecutive versions (each older one against the next newer):
    share of elements bit-identical; per byte position (most significant first) the share
    of XOR bytes that are zero; and the order-0 entropy of each byte plane of the piece, of
    its XOR and of its zigzag difference, summed and divided by 8 bits: roughly what a coder
    that codes each byte plane on its own, without context, could reach (pieces >= 4 KiB)."""
    same: dict[str, list[int]] = {}
    zero: dict[str, np.ndarray] = {}
    hists: dict[tuple[str, str], np.ndarray] = {}
    for older, newer in zip(series, series[1:]):
        for p, data, base in jobs_of(older, newer):
            if base is None or p.elem_size not in (2, 4, 8):
                continue
            dt = np.dtype(f"u{p.elem_size}")
            s = same.setdefault(p.category, [0, 0])
            s[0] += int(np.count_nonzero(data.view(dt) == base.view(dt)))
            s[1] += data.size // p.elem_size
            x = np.bitwise_xor(data, base).reshape(-1, p.elem_size)
            zero[p.category] = zero.get(p.category, 0) + (x == 0).sum(axis=0)[::-1]
            if p.length < 4096:
                continue
            for kind, buf in (("whole", data), ("xor", x.reshape(-1)),
                              ("sub", TRANSFORMS["sub"].forward(data, base, p.elem_size))):
                planes = buf.reshape(-1, p.elem_size).T
                h = np.stack([np.bincount(planes[b], minlength=256) for b in range(p.elem_size)])
                key = (p.category, kind)
                hists[key] = hists[key] + h if key in hists else h
    out: dict[str, dict[str, Any]] = {}
    for c, s in same.items():
        out[c] = {"identical": round(s[0] / max(s[1], 1), 4),
                  "zero_xor_bytes_msb_first": [round(float(z) / max(s[1], 1), 3) for z in zero[c]]}
        for kind in ("whole", "xor", "sub"):
            if (c, kind) in hists:
                h = hists[(c, kind)]
                out[c][f"entropy_{kind}"] = round(_plane_entropy_bits(h) / (8 * h.sum()), 3)
    return out
