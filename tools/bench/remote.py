"""The remote tier against its engine (issue 17): `python -m tools.bench.remote`, or
`make bench ARGS="--only remote"`. Everything in one run, against a single-node Ceph RGW the
bench starts on 127.0.0.1 (or `--endpoint URL` with AWS_* keys in the environment):

* rgw-get: the engine's own GET speed for a `size` object: one whole GET, and 4 MiB ranged
  GETs by 8 threads (what a consumer does), `reps` times each;
* saves: a series of `saves` checkpoints of `size` new random bytes (write + fsync + close)
  through a mount, into a store with a remote and one without, alternating per save; and
  the time from the last close of the remote arm until the bucket holds that generation;
* notice: `versions` new versions of a 4 MiB file on the producer; for each, the time from
  close() returning to the consumer's `cowfs watch` printing it (pushed notices);
* consumer-read: a cold read (consumer's block cache emptied by a remount, page cache
  dropped) of the newest `size` file, against rgw-get;
* shared-prefix: a second store writing the same series into the same prefix: bucket pack
  bytes against one store's stored bytes.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator

import boto3
from botocore.config import Config

from cowfs.mountinfo import mounted_cowfs
from tools.harnessutil import run_cowfs
from tests.support.rgw import RgwCluster

from .mounting import drop_caches, init_store, mounted

MIB = 1 << 20


@contextlib.contextmanager
def bench_engine(work: Path) -> Iterator[tuple[RgwCluster, str]]:
    """A one-node Ceph RGW under `work`, its keys in AWS_* of this process and a bucket
    `bench` made; yields the cluster and its endpoint."""
    with RgwCluster(work / "rgw") as cluster:
        creds = cluster.credentials
        assert creds is not None
        os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"] = creds.access_key, creds.secret_key
        _client(creds.endpoint).create_bucket(Bucket="bench")
        yield cluster, creds.endpoint


def _client(endpoint: str) -> Any:
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                        config=Config(s3={"addressing_style": "path"}, signature_version="s3v4",
                                      max_pool_connections=16))


def ranged_gets(endpoint: str, bucket: str, key: str, size: int) -> float:
    """MB/s of 4 MiB ranged GETs of a whole `size`-byte object by 8 threads (what a consumer does)."""
    c = _client(endpoint)

    def part(k: int) -> int:
        end = min(size, (k + 1) * 4 * MIB) - 1
        return len(c.get_object(Bucket=bucket, Key=key, Range=f"bytes={k * 4 * MIB}-{end}")["Body"].read())

    t = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        assert sum(pool.map(part, range((size + 4 * MIB - 1) // (4 * MIB)))) == size
    return size / (time.perf_counter() - t) / 1e6


def rgw_get(endpoint: str, bucket: str, size: int, reps: int) -> dict[str, list[float]]:
    c = _client(endpoint)
    blob = os.urandom(size)
    c.put_object(Bucket=bucket, Key="bench/get-baseline", Body=blob)
    whole, ranged = [], []
    for _ in range(reps):
        t = time.perf_counter()
        assert len(c.get_object(Bucket=bucket, Key="bench/get-baseline")["Body"].read()) == size
        whole.append(size / (time.perf_counter() - t) / 1e6)
        ranged.append(ranged_gets(endpoint, bucket, "bench/get-baseline", size))
    return {"whole_mb_s": whole, "ranged_8x4MiB_mb_s": ranged}


def _save(path: Path, size: int) -> float:
    t = time.perf_counter()
    with open(path, "wb") as f:
        for _ in range(size // (4 * MIB)):
            f.write(os.urandom(4 * MIB))
        f.flush()
        os.fsync(f.fileno())
    return time.perf_counter() - t


def _status(target: Path) -> dict[str, Any]:
    return json.loads(run_cowfs("remote", "status", str(target), "--json").stdout)


def _wait(cond: Any, deadline: float = 600.0) -> None:
    end = time.monotonic() + deadline
    while not cond():
        if time.monotonic() > end:
            raise RuntimeError("bench: a condition did not come true in 600 s")
        time.sleep(0.01)


def saves(work: Path, url: str, endpoint: str, size: int, n: int) -> dict[str, Any]:
    with_remote = init_store(work / "s-remote")
    plain = init_store(work / "s-plain")
    run_cowfs("remote", "set", str(with_remote), url, "--endpoint", endpoint, "--notify", "127.0.0.1:0")
    times: dict[str, list[float]] = {"remote": [], "plain": []}
    with mounted(with_remote, work / "m-remote") as mr, mounted(plain, work / "m-plain") as mp:
        for k in range(n):
            order = [("remote", mr.mnt), ("plain", mp.mnt)]
            for arm, mnt in (order if k % 2 == 0 else order[::-1]):
                times[arm].append(_save(mnt / f"ckpt-{k}.bin", size))
        t_last = time.perf_counter()
        _wait(lambda: (lambda s: s["catalog_generation"] == s["generation"])(_status(mr.mnt)))
        drain = time.perf_counter() - t_last
    return {"save_s": times, "drain_after_last_close_s": drain, "series_write_s": sum(times["remote"]),
            "store": str(with_remote)}


def _watch_lines(target: Path) -> tuple[subprocess.Popen, "queue.Queue[tuple[float, dict]]"]:
    """`cowfs watch --json` of `target`, its events put in the queue as they come, returned once
    it has subscribed (its "watching" line): events of changes made after are not missed."""
    p = subprocess.Popen([sys.executable, "-m", "cowfs.cli", "watch", str(target), "--json"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    q: queue.Queue[tuple[float, dict]] = queue.Queue()
    said: list[str] = []
    for line in p.stderr:  # type: ignore[union-attr]
        said.append(line)
        if line.startswith("cowfs: watching"):
            break
    else:
        p.wait()
        raise RuntimeError(f"bench: cowfs watch {target} did not start: {''.join(said).strip()}")
    sys.stderr.write("".join(said))

    def read() -> None:
        for line in p.stdout:  # type: ignore[union-attr]
            q.put((time.perf_counter(), json.loads(line)))

    def relay() -> None:  # what it says later (its end), as before
        for line in p.stderr:  # type: ignore[union-attr]
            sys.stderr.write(line)

    threading.Thread(target=read, daemon=True).start()
    threading.Thread(target=relay, daemon=True).start()
    return p, q


@contextlib.contextmanager
def consumer(url: str, endpoint: str, mnt: Path, cache: Path, code: Path | None = None,
             extra: tuple[str, ...] = ()) -> Iterator[Path]:
    """A consumer's read-only mount of the bucket for the body of the with-block, its daemon
    run from the source tree `code` if given (harnessutil.run_cowfs)."""
    mnt.mkdir(exist_ok=True)
    run_cowfs("mount", url, str(mnt), "--read-only", "--cache", str(cache), "--endpoint", endpoint, *extra, code=code)
    try:
        yield mnt
    finally:
        if str(mnt) in mounted_cowfs():
            run_cowfs("umount", str(mnt), code=code)


def notices_and_reads(work: Path, url: str, store: Path, endpoint: str, versions: int, size: int,
                      reps: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with mounted(store, work / "m-remote") as prod:
        with consumer(url, endpoint, work / "cons", work / "cache") as cons:
            watch, q = _watch_lines(cons)
            try:
                def version() -> float:
                    with open(prod.mnt / "live.bin", "wb") as f:
                        f.write(os.urandom(4 * MIB))
                    return time.perf_counter()

                def next_version(timeout: float) -> float:
                    end = time.monotonic() + timeout
                    while True:
                        t, e = q.get(timeout=max(end - time.monotonic(), 0.001))
                        if e.get("kind") == "version" and e.get("path") == "/live.bin":
                            return t

                for _ in range(100):  # until the watch has subscribed: it reports a version
                    version()
                    try:
                        next_version(3.0)
                        break
                    except queue.Empty:
                        pass
                with contextlib.suppress(queue.Empty):  # let late events of those versions pass
                    while True:
                        q.get(timeout=2.0)
                lat: list[float] = []
                for _ in range(versions):
                    t_closed = version()
                    lat.append(next_version(600) - t_closed)
                out["notice_latency_s"] = lat
            finally:
                watch.terminate()
                watch.wait(60)
        newest = sorted((prod.mnt).glob("ckpt-*.bin"))[-1].name
    shutil.rmtree(work / "cache" / "blocks", ignore_errors=True)
    reads, beside = [], []
    for _ in range(reps):  # each read beside one of RGW's own ranged GETs, so both see the same machine
        beside += rgw_get(endpoint, "bench", size, 1)["ranged_8x4MiB_mb_s"]
        drop_caches()
        shutil.rmtree(work / "cache" / "blocks", ignore_errors=True)
        with consumer(url, endpoint, work / "cons", work / "cache") as cons:  # a new daemon: nothing in memory
            t = time.perf_counter()
            with open(cons / newest, "rb", buffering=0) as f:
                while f.read(1 << 20):
                    pass
            reads.append(size / (time.perf_counter() - t) / 1e6)
    out["consumer_read_mb_s"] = reads
    out["rgw_ranged_beside_mb_s"] = beside
    return out


def shared_prefix(work: Path, url: str, endpoint: str, size: int, n: int, first: Path) -> dict[str, Any]:
    second = init_store(work / "s-second")
    run_cowfs("remote", "set", str(second), url, "--endpoint", endpoint)
    # the same bytes: copy the first store's series through the second's mount
    with mounted(first, work / "m-remote") as a, mounted(second, work / "m-second") as b:
        for k in range(n):
            with open(a.mnt / f"ckpt-{k}.bin", "rb") as src, open(b.mnt / f"ckpt-{k}.bin", "wb") as dst:
                while chunk := src.read(4 * MIB):
                    dst.write(chunk)
        _wait(lambda: (lambda s: s["catalog_generation"] == s["generation"])(_status(b.mnt)))
        s1 = json.loads(run_cowfs("stats", str(a.mnt), "--json").stdout)
        s2 = _status(b.mnt)
    return {"first_store_stored_bytes": s1["stored_bytes"], "bucket_pack_bytes": s2["pack_bytes"],
            "second_store_uploaded_bytes": s2["uploaded_bytes"]}


def _renice(pids: Any, nice: int) -> None:
    """Set `nice` on every thread of these processes (Linux keeps it per thread)."""
    for pid in pids:
        for tid in os.listdir(f"/proc/{pid}/task"):
            os.setpriority(os.PRIO_PROCESS, int(tid), nice)


def med(xs: list[float]) -> str:
    return f"{statistics.median(xs):.3g} ({min(xs):.3g}-{max(xs):.3g}, n={len(xs)})"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.bench.remote", description=__doc__.split("\n\n")[0])
    p.add_argument("--size-mib", type=int, default=256)
    p.add_argument("--saves", type=int, default=6)
    p.add_argument("--versions", type=int, default=20)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--dir", default="/var/tmp")
    p.add_argument("--rgw-dir", default=None,
                   help="where the Ceph cluster's files (its OSD's block file) go, e.g. /dev/shm to keep the "
                        "engine's writes off the saves' disk, as on a separate machine (default: under --dir)")
    p.add_argument("--rgw-nice", type=int, default=0,
                   help="nice value for every thread of the Ceph daemons once up (e.g. 19: the engine takes only "
                        "CPU the saves leave, as on a separate machine; default 0)")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    args = p.parse_args(argv)
    size = args.size_mib * MIB
    with tempfile.TemporaryDirectory(prefix="cowfs-bench-remote-", dir=args.dir) as tmp:
        work = Path(tmp)
        rgw_parent = Path(tempfile.mkdtemp(prefix="cowfs-bench-rgw-", dir=args.rgw_dir)) if args.rgw_dir else work
        with contextlib.ExitStack() as cleanup:
            if args.rgw_dir:
                cleanup.callback(shutil.rmtree, rgw_parent, True)
            cluster, endpoint = cleanup.enter_context(bench_engine(rgw_parent))
            if args.rgw_nice:
                _renice(cluster.pids.values(), args.rgw_nice)
            url = "s3://bench/series"
            res: dict[str, Any] = {"size_mib": args.size_mib}
            res["rgw_get"] = rgw_get(endpoint, "bench", size, args.reps)
            print(json.dumps(res["rgw_get"]), flush=True)
            res["saves"] = saves(work, url, endpoint, size, args.saves)
            print(json.dumps(res["saves"]), flush=True)
            res.update(notices_and_reads(work, url, Path(res["saves"]["store"]), endpoint, args.versions, size,
                                         args.reps))
            print(json.dumps({k: res[k] for k in ("notice_latency_s", "consumer_read_mb_s", "rgw_ranged_beside_mb_s")}),
                  flush=True)
            res["shared"] = shared_prefix(work, url, endpoint, size, args.saves, Path(res["saves"]["store"]))
    s = res["saves"]
    ratio = [a / b for a, b in zip(s["save_s"]["remote"], s["save_s"]["plain"])]
    print(f"rgw GET whole MB/s: {med(res['rgw_get']['whole_mb_s'])}; ranged 8x4MiB: {med(res['rgw_get']['ranged_8x4MiB_mb_s'])}")
    print(f"save with remote / without, per pair: {med(ratio)}")
    print(f"in the bucket {s['drain_after_last_close_s']:.2f} s after the last close; series written in "
          f"{s['series_write_s']:.2f} s (ratio {s['drain_after_last_close_s'] / s['series_write_s']:.2f})")
    print(f"notice latency s: median {statistics.median(res['notice_latency_s']):.3f}, max {max(res['notice_latency_s']):.3f}")
    per_rep = [a / b for a, b in zip(res["consumer_read_mb_s"], res["rgw_ranged_beside_mb_s"])]
    print(f"consumer cold read MB/s: {med(res['consumer_read_mb_s'])}; RGW's ranged GETs beside each: "
          f"{med(res['rgw_ranged_beside_mb_s'])}; ratio per rep {med(per_rep)}")
    sh = res["shared"]
    print(f"shared prefix: bucket pack bytes {sh['bucket_pack_bytes']} vs one store's stored {sh['first_store_stored_bytes']}"
          f" (second store uploaded {sh['second_store_uploaded_bytes']})")
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
