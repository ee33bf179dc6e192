"""One workload's series: train, save every checkpoint through the mount and with every
baseline (interleaved, order rotated per checkpoint), then restore, compaction (`cowfs
compact` + `cowfs gc`, then the unchanged re-save once more), snapshot and prune + gc.

Returns a plain dict (JSON-able) with every raw figure; report.py summarises it.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors.torch import load_file

from . import savers
from .compactstep import compact_and_gc
from .mounting import Mount, drop_caches, init_store, mounted
from .workloads import Workload, changed_bytes, copy_flat

READ_BLOCK = 4 << 20


def read_file(path: Path) -> float:
    """Seconds to read `path` sequentially in 4 MiB blocks."""
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while f.read(READ_BLOCK):
            pass
    return time.perf_counter() - t0


def timed_load(path: Path, hf: bool) -> float:
    t0 = time.perf_counter()
    if hf:
        obj: Any = load_file(str(path))
        for t in obj.values():  # load_file maps the file: read one byte of every page, so all of it is read
            if t.numel():
                int(t.reshape(-1).view(torch.uint8)[::4096].sum())
    else:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    del obj
    return time.perf_counter() - t0


def _cowfs_save(m: Mount, wl: Workload, run_dir: Path, obj: Any) -> tuple[savers.SaveResult, float]:
    cpu0 = m.cpu()
    if wl.hf:
        r = savers.save_hf(run_dir, wl, durable=False)  # every close through cowfs is durable
    else:
        r = savers.cowfs_torch(obj, run_dir / "model.pt", probe=m.spilled)
    return r, m.cpu() - cpu0


def _methods(wl: Workload) -> list[str]:
    if wl.hf:
        return ["cowfs", "hf plain", "hf+fsync"]
    return ["cowfs", *savers.BASELINES]


def _baseline_save(method: str, wl: Workload, k: int, plain: Path, obj: Any, flat: dict[str, torch.Tensor]) -> savers.SaveResult:
    if method == "hf plain":
        return savers.save_hf(plain / "hf-plain", wl, durable=False)
    if method == "hf+fsync":
        return savers.save_hf(plain / "hf-fsync", wl, durable=True)
    b = savers.BASELINES[method]
    return b.fn(obj if b.saves == "torch" else flat, plain / b.filename.format(k=k))


def run_series(wl: Workload, checkpoints: int, work: Path, log: Callable[[str], None]) -> dict[str, Any]:
    store, mnt, plain = work / "store", work / "mnt", work / "plain"
    for d in ("a", "b", "c", "hf-plain", "hf-fsync"):
        (plain / d).mkdir(parents=True)
    init_store(store)
    methods = _methods(wl)
    rows: list[dict[str, Any]] = []
    out: dict[str, Any] = {"workload": wl.name, "description": wl.description, "methods": methods, "checkpoints": rows}
    with mounted(store, mnt) as m:
        run_dir = mnt / "run"
        run_dir.mkdir()
        prev_flat: dict[str, torch.Tensor] | None = None
        prev_stored = m.stats()["stored_bytes"]
        obj: Any = None
        for k in range(1, checkpoints + 1):
            t = time.perf_counter()
            wl.advance()
            train_s = time.perf_counter() - t
            flat = wl.flat()
            obj = None if wl.hf else wl.torch_object()
            changed, total = changed_bytes(prev_flat, flat)
            prev_flat = copy_flat(flat)
            saves: dict[str, Any] = {}
            order = methods[k % len(methods):] + methods[:k % len(methods)]
            for method in order:
                if method == "cowfs":
                    r, cpu = _cowfs_save(m, wl, run_dir, obj)
                    saves[method] = {**vars(r), "daemon_cpu_s": cpu}
                else:
                    saves[method] = vars(_baseline_save(method, wl, k, plain, obj, flat))
            st = m.stats()
            t = time.perf_counter()
            os.mkdir(mnt / ".snapshots" / f"ckpt-{k}")
            snap_s = time.perf_counter() - t
            rows.append({
                "k": k, "step": wl.step, "loss": wl.loss, "train_s": train_s, "changed_bytes": changed, "tensor_bytes": total,
                "saves": saves, "order": order, "snapshot_s": snap_s,
                "cowfs_new_stored": st["stored_bytes"] - prev_stored, "cowfs_stored": st["stored_bytes"],
                "cowfs_logical": st["logical_bytes"], "cowfs_physical": st["physical_bytes"],
                "plain_du": savers.du(plain / ("hf-plain" if wl.hf else "a")),
            })
            prev_stored = st["stored_bytes"]
            log(f"  {wl.name} ckpt {k}/{checkpoints}: train {train_s:.1f}s, "
                + ", ".join(f"{n} {s['seconds']:.2f}s" for n, s in saves.items())
                + f", new stored {rows[-1]['cowfs_new_stored'] / 2**20:.1f} MiB of {saves['cowfs']['bytes'] / 2**20:.1f}")
        # the same checkpoint again, unchanged: how many new bytes?
        if wl.hf:  # the same files (same step, same state) into a new directory
            savers.save_hf(run_dir, wl, durable=False, keep=None, name=f"again-{wl.step}")
        else:
            _cowfs_save(m, wl, run_dir, obj)
        out["unchanged_resave_new_bytes"] = m.stats()["stored_bytes"] - prev_stored
    out["restore"] = measure_restore(wl, store, mnt, plain, out)
    return out


def compact_series(m: Mount, wl: Workload) -> dict[str, Any]:
    """Stored bytes before and after `cowfs compact` + `cowfs gc` of the whole series (every
    checkpoint and the unchanged re-save); then the last checkpoint saved once more, unchanged:
    what it adds as saved (raw content-defined chunks, which do not match the compacted
    pieces), and after a second compact + gc (its pieces are the stored ones)."""
    run_dir = m.mnt / "run"
    before = m.stats()
    step = compact_and_gc(m.mnt)
    after = m.stats()
    if wl.hf:
        savers.save_hf(run_dir, wl, durable=False, keep=None, name=f"again-compacted-{wl.step}")
    else:
        _cowfs_save(m, wl, run_dir, wl.torch_object())
    resaved = m.stats()
    again = compact_and_gc(m.mnt)
    final = m.stats()
    return {"stats_before": before, "step": step, "stats_after": after, "resave_stats": resaved,
            "resave_step": again, "resave_final_stats": final,
            "resave_new_bytes": resaved["stored_bytes"] - after["stored_bytes"],
            "resave_new_bytes_compacted": final["stored_bytes"] - after["stored_bytes"]}


def measure_restore(wl: Workload, store: Path, mnt: Path, plain: Path, out: dict[str, Any], reps: int = 3) -> dict[str, Any]:
    """Cold reads of the last checkpoint from a fresh mount and from the disk, alternating,
    `reps` times (page cache dropped before each); then compaction (compact_series) and
    prune --keep-last 1 (+ gc)."""
    if wl.hf:
        last = sorted((plain / "hf-plain").glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))[-1]
        disk_file, rel = last / "model.safetensors", Path("run") / last.name / "model.safetensors"
    else:
        disk_file, rel = plain / "b" / "model.pt", Path("run") / "model.pt"
    res: dict[str, Any] = {"file": str(rel), "bytes": disk_file.stat().st_size,
                           "loader": "safetensors.load_file" if wl.hf else "torch.load"}
    loads: dict[str, list[float]] = {"disk_load_s": [], "cowfs_load_s": [], "disk_read_s": [], "cowfs_read_s": []}
    with mounted(store, mnt) as m:  # a fresh mount: nothing of the file in any cache
        for _ in range(reps):  # the first cowfs load is the fresh mount's; later ones follow a cache drop
            res["dropped_caches"] = drop_caches()
            loads["cowfs_load_s"].append(timed_load(mnt / rel, wl.hf))
            drop_caches()
            loads["disk_load_s"].append(timed_load(disk_file, wl.hf))
            drop_caches()
            loads["cowfs_read_s"].append(read_file(mnt / rel))
            drop_caches()
            loads["disk_read_s"].append(read_file(disk_file))
        res.update(loads)
        out["compaction"] = compact_series(m, wl)
        before = m.stats()
        t = time.perf_counter()
        pr = m.call("prune", keep_last=1)
        prune_s = time.perf_counter() - t
        after = m.stats()
        out["prune"] = {"wall_s": prune_s, "gc": pr["gc"], "snapshots_removed": sum(not s["keep"] for s in pr["snapshots"]),
                        "history_rows_dropped": pr["history_rows_dropped"], "stats_before": before, "stats_after": after}
    return res

