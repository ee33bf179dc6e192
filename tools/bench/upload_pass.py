"""`python -m tools.bench.upload_pass`: what one small upload pass costs (issue 35).

    python -m tools.bench.upload_pass [--passes N] [--file-mib M] [--code DIR ...]

A single-node Ceph RGW started on 127.0.0.1 (tools/bench/remote.py); per arm, a new store
with a remote in its own prefix, one first pass, then `--passes` times: a new file of
`--file-mib` MiB of random bytes, and one pass (`RemoteTier.push`, as the daemon runs it
after a close). Each pass's wall and CPU seconds, and the S3 requests it made by kind
(counted in botocore's before-call event). `--code DIR` adds an arm that runs another source
tree (a worktree of another commit with its extension built in place), in a process of its
own; the arms run one after the other, each against the same RGW.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from tools.harnessutil import run_in_tree

from .docs import REPO

ARM = r"""
import collections, json, os, subprocess, sys, time
from pathlib import Path
from cowfs.remote.config import RemoteConfig
from cowfs.remote.tier import tier_of
from cowfs.store import ROOT_INO, Store
work, endpoint, url, passes, mib = Path(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
calls = collections.Counter()
path = work / url.rsplit("/", 1)[1]
subprocess.run([sys.executable, "-m", "cowfs.cli", "init", str(path)], check=True, capture_output=True)
out = {"wall": [], "cpu": [], "requests": []}
with Store.open(path) as s:
    s.mkdir(ROOT_INO, b"run")
    tier = tier_of(s)
    tier.set(RemoteConfig(url, endpoint=endpoint))
    tier.push()
    client = tier.bucket().client
    client.meta.events.register("before-call.s3", lambda model, **kw: calls.update([model.name]))
    for i in range(passes):
        s.write_file(f"/run/f{i}.bin", os.urandom(mib << 20))
        calls.clear()
        w, c = time.perf_counter(), time.process_time()
        tier.push()
        out["wall"].append(time.perf_counter() - w)
        out["cpu"].append(time.process_time() - c)
        out["requests"].append(dict(calls))
print(json.dumps(out))
"""


def run_arm(code: Path, work: Path, endpoint: str, url: str, passes: int, mib: int) -> dict:
    """One arm in a process of its own: its store under `work`, its remote `url` (a prefix of
    its own: s3://BUCKET/NAME)."""
    return json.loads(run_in_tree(code, ARM, str(work), endpoint, url, str(passes), str(mib)).splitlines()[-1])


def table(arms: list[tuple[Path, dict]]) -> str:
    lines = ["| arm | wall s per pass: median [min-max] | CPU s per pass: median [min-max] | requests per pass (median by kind) |",
             "| --- | --- | --- | --- |"]
    for code, r in arms:
        kinds = sorted({k for req in r["requests"] for k in req})
        per_kind = ", ".join(f"{k} {statistics.median(req.get(k, 0) for req in r['requests']):g}" for k in kinds)
        wall, cpu = r["wall"], r["cpu"]
        lines.append(f"| {code} | {statistics.median(wall):.3f} [{min(wall):.3f}-{max(wall):.3f}] | "
                     f"{statistics.median(cpu):.3f} [{min(cpu):.3f}-{max(cpu):.3f}] | {per_kind} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.bench.upload_pass", description=__doc__.splitlines()[0])
    ap.add_argument("--passes", type=int, default=10)
    ap.add_argument("--file-mib", type=int, default=4)
    ap.add_argument("--code", type=Path, action="append", default=[], help="another source tree to compare")
    ap.add_argument("--dir", type=Path, default=Path("/var/tmp"))
    args = ap.parse_args(argv)
    if args.passes < 1 or args.file_mib < 1:
        ap.error("--passes and --file-mib must be at least 1")
    arms = [REPO, *(c.resolve() for c in args.code)]
    for c in arms[1:]:
        if not (c / "cowfs").is_dir():
            ap.error(f"--code {c}: no cowfs/ there")
    from .remote import bench_engine  # starts Ceph: imported only when the arguments are good

    with tempfile.TemporaryDirectory(prefix="cowfs-bench-pass-", dir=args.dir) as tmp:
        work = Path(tmp)
        with bench_engine(work) as (_, endpoint):
            results = [(code, run_arm(code, work, endpoint, f"s3://bench/arm{k}", args.passes, args.file_mib))
                       for k, code in enumerate(arms)]
    print(f"upload passes of one new {args.file_mib} MiB file each, {args.passes} per arm\n")
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
