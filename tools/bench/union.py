"""One namespace for a job (issue 35): `python -m tools.bench.union`, or `make bench-union`.
Against a single-node Ceph RGW the bench starts on 127.0.0.1 (tools/bench/remote.py), for
each N in `--producers` (default 2 4 8): N stores, each mounted by its own daemon with a
remote in one prefix and `--notify`, and one consumer mounted with `--all-stores`. Each rep
is one DCP-shaped checkpoint: every producer writes its rank's `__R_0.distcp` (`--file-mib`
of new random bytes) into `step-K/` at once, then rank 0 writes `.metadata` naming all of
them. The latency is from the last of those closes returning to the moment the consumer's
`cowfs watch` has reported every file of the checkpoint (then `cowfs checkpoints` on the
consumer must list it: checked, not timed). Target: at most 1 s.

A second figure says whether a notice's cost grows with the stores: the same latency for
N = 2 after each producer has written `--filler` more files (a larger catalog per store).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import pickle
import queue
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator

from tools.harnessutil import run_cowfs

from .mounting import Mount, init_store, mounted
from .remote import _watch_lines, bench_engine, consumer

MIB = 1 << 20
TARGET_S = 1.0


def metadata(ranks: int) -> bytes:
    """A stand-in for DCP's pickled Metadata naming each rank's file (what cowfs reads of it)."""
    return pickle.dumps({"storage_data": {f"rank{r}": (f"__{r}_0.distcp", 0, 1) for r in range(ranks)}})


def _write(path: Path, blob: bytes) -> float:
    with open(path, "wb") as f:
        f.write(blob)
    return time.perf_counter()


@contextlib.contextmanager
def producers(work: Path, url: str, endpoint: str, n: int) -> Iterator[list[Mount]]:
    with contextlib.ExitStack() as stack:
        mounts = []
        for i in range(n):
            store = init_store(work / f"node{i}", segment_size="64M")
            run_cowfs("remote", "set", str(store), url, "--endpoint", endpoint, "--notify", "127.0.0.1:0")
            mounts.append(stack.enter_context(mounted(store, work / f"n{i}")))
        yield mounts


def _wait_files(q: "queue.Queue[tuple[float, dict]]", want: set[str], timeout: float) -> float:
    """The time the watch reported the last of `want` (paths)."""
    end = time.monotonic() + timeout
    left = set(want)
    last = 0.0
    while left:
        t, e = q.get(timeout=max(end - time.monotonic(), 0.001))
        if e.get("kind") == "version" and e.get("path") in left:
            left.discard(e["path"])
            last = t
    return last


def one_run(work: Path, endpoint: str, n: int, reps: int, file_mib: int, filler: int) -> dict[str, Any]:
    url = f"s3://bench/job-{n}-{filler}"
    lat: list[float] = []
    with producers(work / f"p{n}-{filler}", url, endpoint, n) as nodes:
        for i, node in enumerate(nodes):
            (node.mnt / "job").mkdir()
            for k in range(filler):  # a larger catalog in every store
                _write(node.mnt / "job" / f"filler-{i}-{k}", b"x" * 100)
        with consumer(url, endpoint, work / f"cons-{n}-{filler}", work / f"cache-{n}-{filler}",
                      extra=("--all-stores",)) as cons:
            watch, q = _watch_lines(cons)
            try:
                pool = ThreadPoolExecutor(n)
                for k in range(-1, reps):  # k = -1: until the watch subscribed and every store is followed
                    step = f"job/step-{k + 1}"
                    for node in nodes:
                        (node.mnt / step).mkdir()
                    blobs = [bytes(file_mib * MIB) if k < 0 else os.urandom(file_mib * MIB) for _ in nodes]
                    closes = list(pool.map(lambda ib: _write(nodes[ib[0]].mnt / step / f"__{ib[0]}_0.distcp", ib[1]),
                                           enumerate(blobs)))
                    closes.append(_write(nodes[0].mnt / step / ".metadata", metadata(n)))
                    want = {f"/{step}/__{r}_0.distcp" for r in range(n)} | {f"/{step}/.metadata"}
                    try:
                        seen = _wait_files(q, want, 600 if k >= 0 else 120)
                    except queue.Empty:
                        raise RuntimeError(f"bench: the consumer did not report {step} whole") from None
                    if k >= 0:
                        lat.append(seen - max(closes))
                        listed = json.loads(run_cowfs("checkpoints", str(cons), "--json").stdout)
                        if f"/{step}" not in {c["path"] for c in listed}:
                            raise RuntimeError(f"bench: {step} seen whole but not listed as complete")
                pool.shutdown()
            finally:
                watch.terminate()
                watch.wait(60)
    return {"producers": n, "filler_files": filler, "latency_s": lat}


def table(results: list[dict[str, Any]]) -> list[str]:
    """The Markdown table of the runs: every rep, the median and the worst, the target met
    when the worst rep is within it."""
    out = ["| producers | files per store before | latency s (each rep) | median | max | target <= 1 s |",
           "| --- | --- | --- | --- | --- | --- |"]
    for r in results:
        lat = r["latency_s"]
        met = "met" if max(lat) <= TARGET_S else "not met"
        out.append(f"| {r['producers']} | {r['filler_files']} | {' / '.join(f'{x:.2f}' for x in lat)} | "
                   f"{statistics.median(lat):.2f} | {max(lat):.2f} | {met} |")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.bench.union", description=__doc__.split("\n\n")[0])
    p.add_argument("--producers", type=int, nargs="+", default=[2, 4, 8])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--file-mib", type=int, default=4)
    p.add_argument("--filler", type=int, default=500, help="files per store in the larger-store run (0: skip it)")
    p.add_argument("--dir", default="/var/tmp")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    p.add_argument("--keep-logs", default=None, metavar="DIR",
                   help="copy every daemon's log (producers' and the consumer's) here before the work files go")
    args = p.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory(prefix="cowfs-bench-union-", dir=args.dir) as tmp:
        work = Path(tmp)
        with bench_engine(work) as (_cluster, endpoint):
            runs = [(n, 0) for n in args.producers] + ([(2, args.filler)] if args.filler else [])
            for n, filler in runs:
                r = one_run(work, endpoint, n, args.reps, args.file_mib, filler)
                if args.keep_logs:
                    keep = Path(args.keep_logs) / f"p{n}-{filler}"
                    keep.mkdir(parents=True, exist_ok=True)
                    for log in work.glob(f"*{n}-{filler}*/**/cowfs.log"):
                        shutil.copy(log, keep / f"{log.parent.name}.log")
                results.append(r)
                print(json.dumps(r), flush=True)
    print("\n" + "\n".join(table(results)))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
