"""The issue-14 workload: a real transformers Trainer series written by Trainer itself into
a mount, then compacted (docs/benchmarks.md, "Compaction (issue 14)").

For each dtype (bf16: model and AdamW states in bfloat16; fp32) and each repetition, two
arms, in alternating order, each a new store and a new Trainer run
(tools/bench/trainer_series.py in a child process, output_dir on the mount, a checkpoint
every 20 steps, 10 checkpoints, no rotation; every `_save_checkpoint` timed):

* **off**: mounted with `--compact-idle off`. After training: the newest checkpoint read
  cold from a fresh mount (the store as saved), then `cowfs compact` + `cowfs gc` (timed:
  compaction throughput), stats, and from another fresh mount cold reads of the newest and
  the oldest checkpoint, then of every checkpoint (VERSION_READ_REPS each: the oldest is a
  keyframe, stored whole; the ones after it are deltas), a check that every file reads as
  it was written (sha256), and `cowfs fsck`. In the first repetition restic and borg store the same checkpoints (read
  from the mount) beside it (tools/bench/peers.py).
* **idle**: mounted with `--compact-idle 1s`, so the daemon compacts between saves. After
  training: the wait until it has compacted everything, `cowfs compact` (whatever is left)
  + `cowfs gc`, stats, the daemon's compaction runs from its log, and the newest checkpoint
  read cold from a fresh mount.

Then one torch.save series per dtype that rewrites one path (`model.pt`, model + AdamW
state, 10 times; cowfs keeps every version): compact + gc, stats, fsck.

Cold reads: every file of a checkpoint read in 4 MiB blocks, the page cache dropped before
each read (`drop_caches`), `read_reps` times, the first one the fresh mount's.
"""
from __future__ import annotations

import json
import re
import shutil
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any, Callable

from tools.harnessutil import sha_file

from . import peers, seriescache
from .compactstep import compact_and_gc, compact_MBps, fsck, written_bytes
from .mounting import Mount, drop_caches, init_store, mounted
from .series import read_file

DTYPES = ("bf16", "fp32")
SAVE_STEPS = 20
IDLE = "1s"
VERSION_READ_REPS = 2  # cold reads of every checkpoint of the compacted store, per run
RUN = "run"  # Trainer's output_dir, under the mountpoint
# cowfs.fs.idle_compaction.COMPACTED_LOG, as the daemon writes it
COMPACTED_LINE = re.compile(r"compacted (\d+) files \((\d+) bytes\): (\d+) new pieces, (\d+) deltas, (\d+) regrouped,"
                            r" in ([0-9.]+)s")
Log = Callable[[str], None]


def tree_digests(root: Path) -> dict[str, str]:
    return {str(f.relative_to(root)): sha_file(f)[0] for f in sorted(root.rglob("*")) if f.is_file()}


def cold_reads(m: Mount, targets: dict[str, Path], reps: int) -> dict[str, Any]:
    """Seconds to read every file under each target (relative to the mountpoint), page
    cache dropped before each read; the targets alternate in order from one rep to the next."""
    files = {k: sorted(f for f in (m.mnt / rel).rglob("*") if f.is_file()) if (m.mnt / rel).is_dir() else [m.mnt / rel]
             for k, rel in targets.items()}
    out: dict[str, Any] = {k: {"bytes": sum(f.stat().st_size for f in fs), "seconds": []} for k, fs in files.items()}
    dropped = True
    labels = list(targets)
    for r in range(reps):
        for label in (labels if r % 2 == 0 else labels[::-1]):
            dropped = drop_caches() and dropped
            out[label]["seconds"].append(sum(read_file(f) for f in files[label]))
    out["caches_dropped"] = dropped
    return out


def train_into(m: Mount, series: str, checkpoints: int, scratch: Path, log: Log) -> dict[str, Any]:
    """Run the Trainer (or plain torch.save) series in a child process writing into the mount."""
    times, info = scratch / "save-times.json", scratch / "series.json"
    extra = ["--save-times", str(times), "--info", str(info)] + (["--one-path"] if series.startswith("plain-") else [])
    cmd = seriescache.command(series, m.mnt / RUN, checkpoints, SAVE_STEPS, *extra)
    cpu0, t0 = m.cpu(), time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=seriescache.REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, stdin=subprocess.DEVNULL)
    try:
        _, err = proc.communicate()
    except BaseException:  # interrupted: the child must not go on writing into a mount being unmounted
        proc.kill()
        proc.wait()
        raise
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[2:])} failed ({proc.returncode}): {err.strip()[-2000:]}")
    save_s = json.loads(times.read_text())
    log(f"    {series}: {len(save_s)} saves in {wall:.0f} s of training, save s median {statistics.median(save_s):.3f} "
        f"[{min(save_s):.3f}-{max(save_s):.3f}]")
    return {"save_s": save_s, "train_wall_s": wall, "daemon_cpu_s": m.cpu() - cpu0, "info": json.loads(info.read_text())}


def wait_compacted(m: Mount, timeout: float = 900) -> float:
    """Seconds until the daemon's idle compaction has left no body uncompacted."""
    t0 = time.perf_counter()
    while m.stats()["uncompacted_bodies"] and time.perf_counter() - t0 < timeout:
        time.sleep(0.5)
    return time.perf_counter() - t0


def daemon_compactions(store: Path) -> dict[str, Any]:
    """The daemon's own compaction runs, from STORE/cowfs.log, and its warnings and errors."""
    runs, problems = [], []
    text = (store / "cowfs.log").read_text(errors="replace")
    for line in text.splitlines():
        if (hit := COMPACTED_LINE.search(line)):
            runs.append({"files": int(hit[1]), "bytes": int(hit[2]), "pieces": int(hit[3]), "deltas": int(hit[4]),
                         "regrouped": int(hit[5]), "seconds": float(hit[6])})
        elif " WARNING " in line or " ERROR " in line:
            problems.append(line.split(" ", 3)[-1][:300])
    return {"runs": runs, "problems": problems}


def _newest_oldest(info: dict[str, Any]) -> tuple[Path, Path]:
    versions = info["versions"]
    return Path(RUN) / versions[-1], Path(RUN) / versions[0]


def _versions(info: dict[str, Any]) -> dict[str, Path]:
    return {v: Path(RUN) / v for v in info["versions"]}


def off_arm(series: str, d: Path, checkpoints: int, read_reps: int, with_peers: bool, log: Log) -> dict[str, Any]:
    store, mnt = init_store(d / "store"), d / "mnt"
    with mounted(store, mnt) as m:
        res = train_into(m, series, checkpoints, d, log)
        res["stats_written"] = m.stats()
        res["digests"] = tree_digests(mnt / RUN)
    res["written_saved"] = written_bytes(store)
    newest, oldest = _newest_oldest(res["info"])
    with mounted(store, mnt) as m:  # a fresh mount: the store as saved, read cold
        res["reads_saved"] = cold_reads(m, {"newest": newest}, read_reps)
        res["step"] = compact_and_gc(mnt)
        res["stats_compacted"] = m.stats()
    res["written_compacted"] = written_bytes(store)
    with mounted(store, mnt) as m:  # a fresh mount again: the compacted store
        res["reads_compacted"] = cold_reads(m, {"newest": newest, "oldest": oldest}, read_reps)
        res["reads_versions"] = cold_reads(m, _versions(res["info"]), VERSION_READ_REPS)
        res["identical"] = tree_digests(mnt / RUN) == res.pop("digests")
        res["fsck"] = fsck(mnt)
        if with_peers:
            log(f"    {series}: restic and borg, reading the checkpoints from the mount")
            res["peers"] = peers.measure(mnt / RUN, d / "peers")
            for out in res["peers"].values():
                if out is not None:  # the same files, so the same logical size as the store's
                    out["ratio"] = out["repo_bytes"] / res["stats_written"]["logical_bytes"]
    res["daemon_log"] = daemon_compactions(store)
    _log_arm(series, "off", res, log)
    return res


def idle_arm(series: str, d: Path, checkpoints: int, read_reps: int, log: Log) -> dict[str, Any]:
    store, mnt = init_store(d / "store"), d / "mnt"
    with mounted(store, mnt, compact_idle=IDLE) as m:
        res = train_into(m, series, checkpoints, d, log)
        res["idle_left"] = m.stats()["uncompacted_bytes"]
        res["idle_wait_s"] = wait_compacted(m)
        res["stats_written"] = m.stats()
        res["step"] = compact_and_gc(mnt)
        res["stats_compacted"] = m.stats()
    newest, _ = _newest_oldest(res["info"])
    with mounted(store, mnt) as m:
        res["reads_compacted"] = cold_reads(m, {"newest": newest}, read_reps)
    res["daemon_log"] = daemon_compactions(store)
    _log_arm(series, "idle", res, log)
    return res


def plain_arm(series: str, d: Path, checkpoints: int, log: Log) -> dict[str, Any]:
    """torch.save of model + optimizer rewriting one path, compaction off while saving."""
    store, mnt = init_store(d / "store"), d / "mnt"
    with mounted(store, mnt) as m:
        res = train_into(m, series, checkpoints, d, log)
        res["stats_written"] = m.stats()
        digest = sha_file(mnt / RUN / "model.pt")[0]
        res["step"] = compact_and_gc(mnt)
        res["stats_compacted"] = m.stats()
    res["written_compacted"] = written_bytes(store)
    with mounted(store, mnt) as m:
        res["identical"] = sha_file(mnt / RUN / "model.pt")[0] == digest
        res["fsck"] = fsck(mnt)
    _log_arm(series, "plain", res, log)
    return res


def _log_arm(series: str, arm: str, res: dict[str, Any], log: Log) -> None:
    st = res["stats_compacted"]
    log(f"    {series} {arm}: stored/logical {st['stored_bytes'] / st['logical_bytes']:.3f} after compact + gc "
        f"({st['logical_bytes'] / 1e6:.0f} MB logical), compact {compact_MBps(res['step']):.0f} MB/s "
        f"({res['step']['compact']['logical_bytes'] / 1e6:.0f} MB in {res['step']['compact']['seconds']:.2f} s)"
        + (f", bytes identical: {res['identical']}" if "identical" in res else ""))


def run_compaction(work: Path, reps: int, read_reps: int, log: Log, dtypes: tuple[str, ...] = DTYPES,
                   checkpoints: int = 10, with_peers: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {"dtypes": list(dtypes), "reps": reps, "read_reps": read_reps, "checkpoints": checkpoints,
                           "save_steps": SAVE_STEPS, "idle": IDLE, "trainer": {}, "plain": {}}
    for dtype in dtypes:
        arms: dict[str, list[dict[str, Any]]] = {"off": [], "idle": []}
        for r in range(reps):
            for arm in (("off", "idle") if r % 2 == 0 else ("idle", "off")):
                log(f"  compaction {dtype} rep {r + 1}/{reps}: Trainer into a mount, compact-idle {arm if arm == 'off' else IDLE}")
                d = work / f"{dtype}-{arm}-{r}"
                try:
                    if arm == "off":
                        arms[arm].append(off_arm(dtype, d, checkpoints, read_reps, with_peers and r == 0, log))
                    else:
                        arms[arm].append(idle_arm(dtype, d, checkpoints, read_reps, log))
                finally:
                    shutil.rmtree(d, ignore_errors=True)
        out["trainer"][dtype] = arms
    for dtype in dtypes:
        log(f"  compaction plain-{dtype}: torch.save rewriting one path")
        d = work / f"plain-{dtype}"
        try:
            out["plain"][dtype] = plain_arm(f"plain-{dtype}", d, checkpoints, log)
        finally:
            shutil.rmtree(d, ignore_errors=True)
    return out
