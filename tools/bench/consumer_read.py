"""`python -m tools.bench.consumer_read [--size-mib N] [--reps R] [--code DIR ...]`: a consumer's
cold read against RGW's own GETs, and where the CPU goes (issue 17: a consumer reads a new
version at >= 0.5x of RGW's GET throughput measured in the same run).

A Ceph RGW on 127.0.0.1 (tests/support/rgw.py), a producer store with one file of N MiB of
random bytes, pushed. Per repetition, for each `--code` tree in turn (A/B: a git worktree of
another commit; default: this tree): 8 threads of 4 MiB ranged GETs of an object of the same
size (RGW's own speed, beside this read), then a new consumer daemon from that tree (its
block cache emptied, page cache dropped) and one sequential read of the file in 1 MiB
reads. Prints per read MB/s, the ratio to the GETs beside it, the CPU seconds per GiB of the
Ceph daemons, the consumer daemon and the reading process, and the FUSE READ size the
daemon got (from its mount's read-ahead); then the medians per tree.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tests.support.mountutil import read_ahead_kib
from tools.harnessutil import run_cowfs

from .mounting import cpu_seconds, drop_caches, init_store, mounted
from .remote import _client, bench_engine, consumer, ranged_gets

MIB = 1 << 20


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.bench.consumer_read", description=__doc__.split("\n\n")[0])
    p.add_argument("--size-mib", type=int, default=256)
    p.add_argument("--reps", type=int, default=4)
    p.add_argument("--code", action="append", default=None,
                   help="a source tree to run the consumer from (repeat for A/B; default: this one)")
    p.add_argument("--dir", default="/var/tmp")
    args = p.parse_args(argv)
    size = args.size_mib * MIB
    codes = [Path(c).resolve() for c in (args.code or [Path(__file__).resolve().parents[2]])]
    ratios: dict[Path, list[float]] = {c: [] for c in codes}
    reads: dict[Path, list[float]] = {c: [] for c in codes}
    with tempfile.TemporaryDirectory(prefix="cowfs-bench-cread-", dir=args.dir) as tmp:
        work = Path(tmp)
        with bench_engine(work) as (cluster, endpoint):
            _client(endpoint).put_object(Bucket="bench", Key="get-baseline", Body=os.urandom(size))
            store = init_store(work / "store")
            url = "s3://bench/series"
            run_cowfs("remote", "set", str(store), url, "--endpoint", endpoint)
            with mounted(store, work / "prod") as prod:
                with open(prod.mnt / "ckpt.bin", "wb") as f:
                    for _ in range(size // (4 * MIB)):
                        f.write(os.urandom(4 * MIB))
            run_cowfs("remote", "push", str(store))
            engine = list(cluster.pids.values())
            gib = size / (1 << 30)
            for _ in range(args.reps):
                for code in codes:
                    beside = ranged_gets(endpoint, "bench", "get-baseline", size)
                    drop_caches()
                    shutil.rmtree(work / "cache", ignore_errors=True)
                    with consumer(url, endpoint, work / "cons", work / "cache", code=code):
                        pid = int((work / "cache" / "lock").read_text().split()[0])
                        e0, c0, r0 = sum(map(cpu_seconds, engine)), cpu_seconds(pid), os.times()
                        t = time.perf_counter()
                        with open(work / "cons" / "ckpt.bin", "rb", buffering=0) as f:
                            while f.read(MIB):
                                pass
                        dt = time.perf_counter() - t
                        e1, c1, r1 = sum(map(cpu_seconds, engine)), cpu_seconds(pid), os.times()
                        ra = read_ahead_kib(work / "cons")
                    mb = size / dt / 1e6
                    reads[code].append(mb)
                    ratios[code].append(mb / beside)
                    print(f"{code.name:>16}: read {mb:4.0f} MB/s, RGW's GETs beside {beside:4.0f} MB/s, ratio "
                          f"{mb / beside:.3f} | CPU s/GiB: Ceph {(e1 - e0) / gib:.2f}, consumer {(c1 - c0) / gib:.2f}, "
                          f"reader {(r1.user + r1.system - r0.user - r0.system) / gib:.2f} | read-ahead {ra} KiB",
                          flush=True)
    for code in codes:
        r = ratios[code]
        print(f"{code}: read {statistics.median(reads[code]):.0f} MB/s, ratio median {statistics.median(r):.3f} "
              f"({min(r):.3f}-{max(r):.3f}, n={len(r)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
