"""`python -m tools.bench.consumer_apply [--rows N] [--reps R]`: what one new version costs a
consumer as the store's catalog grows (issue 17: a consumer's step should cost the change,
not the store).

Two producer stores with a remote in one bucket of a Ceph RGW started on 127.0.0.1: a small
one, and one whose catalog carries N more chunk rows (inserted before the first upload,
standing in for a long history: no file uses them, and the store is thrown away). A
consumer's `ReplicaSource` follows each. Per repetition, alternating between the two: one
new 50 KB file on the producer, one upload pass (a delta), then the consumer's
`fetch_catalog` of it, timed: the GET of the delta, the LIST of pack indexes, applying it
to the catalog file and finding what changed. Prints the medians and their ratio
(large / small); 1.0 means the step does not grow with the catalog.

Then, on the producer's side, passes that upload a whole catalog as well as the delta,
alternating likewise: seconds from the pass's start until consumers can be told
(`on_catalog`), and until the pass ends. "due": a whole catalog due by the policy (as after
64 deltas, or when the deltas add up to half the whole; here every pass, with
`upload.MAX_DELTAS` set to 1), "asked": `push(whole=True)`, remote gc's pass.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from cowfs.remote import upload
from cowfs.remote.config import RemoteConfig
from cowfs.remote.source import ReplicaSource
from cowfs.remote.tier import tier_of
from cowfs.store import ROOT_INO, Store
from tests.support.storeutil import data, new_store

from .remote import bench_engine


def _producer(root: Path, url: str, endpoint: str, rows: int) -> Store:
    s = Store.open(new_store(root))
    s.mkdir(ROOT_INO, b"run")
    if rows:
        def pad(txn) -> None:  # type: ignore[no-untyped-def]
            txn.execute("INSERT INTO chunks(hash, seg_id, offset, stored_len, raw_len, first_gen, codec)"
                        " WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?)"
                        " SELECT randomblob(32), 999999, i * 65600, 65536, 65536, 1, 0 FROM n", (rows,))
        s.catalog.write(pad, op="bench-padding")
    tier_of(s).set(RemoteConfig(url, endpoint=endpoint))
    s.write_file("/run/first.bin", data(100_000, 1))
    tier_of(s).push()
    return s


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.bench.consumer_apply", description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1_000_000, help="chunk rows added to the large store's catalog")
    p.add_argument("--reps", type=int, default=8)
    p.add_argument("--dir", default="/var/tmp")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="cowfs-bench-apply-", dir=args.dir) as tmp:
        work = Path(tmp)
        with bench_engine(work) as (_cluster, endpoint):
            arms = {"small": 0, "large": args.rows}
            stores = {k: _producer(work / k, f"s3://bench/{k}", endpoint, n) for k, n in arms.items()}
            sources = {k: ReplicaSource(work / f"cache-{k}", RemoteConfig(f"s3://bench/{k}", endpoint=endpoint),
                                        s.config.store_uuid) for k, s in stores.items()}
            times: dict[str, list[float]] = {k: [] for k in arms}
            told: dict[str, list[float]] = {}
            passes: dict[str, list[float]] = {}
            try:
                for k, src in sources.items():
                    src.fetch_catalog(*src.newest())
                    size = os.path.getsize(stores[k].root / "catalog.db")
                    print(f"{k}: catalog.db {size / 1e6:.1f} MB", flush=True)
                for i in range(args.reps):
                    for k in (list(arms) if i % 2 == 0 else list(reversed(arms))):
                        s = stores[k]
                        s.write_file(f"/run/f{i}.bin", data(50_000, i + 2))
                        r = tier_of(s).push()
                        assert r.delta_key, "the pass uploaded no delta"
                        t = time.perf_counter()
                        got = sources[k].fetch_catalog(r.generation, r.delta_key)
                        times[k].append(time.perf_counter() - t)
                        assert not got.new_file and got.changes.entries
                upload.MAX_DELTAS = 1  # a whole catalog due once there is a delta since the last
                for s in stores.values():
                    s.write_file("/run/start.bin", data(50_000, 99))
                    tier_of(s).push(whole=True)  # no delta since the newest whole catalog
                for how in ("due", "asked"):
                    for i in range(args.reps):
                        for k in (list(arms) if i % 2 == 0 else list(reversed(arms))):
                            s = stores[k]
                            s.write_file(f"/run/w{i}-{how}-a.bin", data(50_000, i + 100))
                            assert not tier_of(s).push().whole_key  # a delta alone: the next pass's whole is due
                            s.write_file(f"/run/w{i}-{how}-b.bin", data(50_000, i + 200))
                            t = time.perf_counter()
                            r = tier_of(s).push(whole=how == "asked", on_catalog=lambda g, key, t=t, at=f"{k}, {how}":
                                                told.setdefault(at, []).append(time.perf_counter() - t))
                            passes.setdefault(f"{k}, {how}", []).append(time.perf_counter() - t)
                            assert r.told and r.whole_key and r.delta_key
            finally:
                for src in sources.values():
                    src.close()
                for s in stores.values():
                    s.close()
    for k, xs in times.items():
        print(f"{k}: per delta {statistics.median(xs):.3f} s ({min(xs):.3f}-{max(xs):.3f}, n = {len(xs)})")
    print(f"large / small: {statistics.median(times['large']) / statistics.median(times['small']):.2f}")
    for k in told:
        print(f"{k}: a pass with a whole catalog: consumers told after {statistics.median(told[k]):.3f} s "
              f"({min(told[k]):.3f}-{max(told[k]):.3f}), the pass ends after {statistics.median(passes[k]):.3f} s "
              f"({min(passes[k]):.3f}-{max(passes[k]):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
