"""`python -m tools.bench.log_appends`: the log's appends alone, from several threads at
once, this tree against others, arms alternating.

    python -m tools.bench.log_appends [--gib 4] [--threads 1 2 4] [--reps 3] [--work /dev/shm] [--code DIR ...]

What bounds a daemon's writes once cutting and hashing run on every core: each append
copies its records into a segment file (`pwrite` into the page cache, or O_DIRECT). This
bench runs only that step. Each arm, in its own process with the cowfs of its tree
(`--code DIR`: a worktree of another commit with its extension built), makes a store
(`file` device, 256 MiB segments) in --work; each of T threads stages 8 MiB of new random
bytes as chunk records once, then appends them again and again, as a write session's
`ChunkWriter.store` does (holding `gc_lock` around the append, shared where the tree's lock
can be shared), --gib GiB in all over the threads, then syncs. It prints, per arm and
thread count, the GiB/s of the appends and the sync and the process's CPU seconds per GiB
(median [min-max] over the reps), and the median of the speed against the first arm's in the
same repetition.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tools.harnessutil import run_in_tree

from .docs import REPO
from .session_stream import TIMED_THREADS, arm_cells

ARM = TIMED_THREADS + r"""
import json, os, shutil, sys, tempfile
from pathlib import Path
from cowfs import _native
from cowfs.store import Store
from cowfs.store.data.chunking import CDC_PARAMS
from cowfs.store.log.records import record_span
gib, work, threads = float(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
BATCH = 8 << 20
root = Path(tempfile.mkdtemp(dir=work, prefix="cowfs-appends-")) / "store"
try:
    Store.init(root, device="file", segment_size=256 << 20)
    store = Store.open(root)
    try:
        lock = store.index.gc_lock
        held = lock.shared if hasattr(lock, "shared") else (lambda: lock)
        batches = int(gib * (1 << 30)) // BATCH // threads
        staged = []
        for _ in range(threads):
            data = os.urandom(BATCH)
            lengths, ids, _ = _native.cdc_hash_batch(CDC_PARAMS, [data], True)
            sizes = memoryview(lengths).cast("I").tolist()
            staged.append((_native.stage_records([data], lengths, ids, b"\1" * len(sizes)), sizes))

        def appender(k):
            buf, sizes = staged[k]
            for _ in range(batches):
                with held():
                    store.log.append_staged(buf, sizes)

        wall, cpu = timed_threads(appender, threads, then=store.log.sync)
        done = batches * threads * BATCH / (1 << 30)
    finally:
        store.close()
finally:
    shutil.rmtree(root.parent, ignore_errors=True)
print(json.dumps({"gib_s": done / wall, "cpu_s_per_gib": cpu / done}))
"""


def run_arm(code: Path, gib: float, work: Path, threads: int) -> dict[str, float]:
    return dict(json.loads(run_in_tree(code, ARM, str(gib), str(work), str(threads))))


def table(arms: list[Path], threads: list[int], runs: dict[tuple[int, int], list[dict[str, float]]]) -> list[str]:
    """Markdown rows: per thread count and arm, GiB/s and CPU s per GiB (median [min-max]),
    and the median of its speed over the first arm's in the same repetition."""
    out = ["| threads | arm | GiB/s | process CPU s per GiB | speed / first arm (median) |",
           "| --- | --- | --- | --- | --- |"]
    for t in threads:
        first = runs[(0, t)]
        for i, arm in enumerate(arms):
            out.append(f"| {t} | {arm} | {arm_cells(runs[(i, t)], first)} |")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.bench.log_appends", description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=4.0, help="GiB appended per arm and repetition (default 4)")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2, 4], help="thread counts (default 1 2 4)")
    ap.add_argument("--reps", type=int, default=3, help="repetitions of every arm, alternating (default 3)")
    ap.add_argument("--work", type=Path, default=Path("/dev/shm"), help="where the stores go (default /dev/shm)")
    ap.add_argument("--code", type=Path, action="append", default=[], help="another source tree to compare")
    args = ap.parse_args(argv)
    if args.reps < 1 or min(args.threads) < 1:
        ap.error("--reps and every --threads must be at least 1")
    if args.gib * (1 << 30) < (8 << 20) * max(args.threads):
        ap.error(f"--gib {args.gib}: at least one 8 MiB batch per thread ({max(args.threads)} threads)")
    if not args.work.is_dir():
        ap.error(f"--work {args.work}: not a directory")
    arms = [REPO, *(c.resolve() for c in args.code)]
    for c in arms[1:]:
        if not (c / "cowfs").is_dir():
            ap.error(f"--code {c}: no cowfs/ there")
    runs: dict[tuple[int, int], list[dict[str, float]]] = {(i, t): [] for i in range(len(arms)) for t in args.threads}
    for rep in range(args.reps):
        order = list(range(len(arms))) if rep % 2 == 0 else list(range(len(arms)))[::-1]
        for t in args.threads:
            for i in order:
                runs[(i, t)].append(run_arm(arms[i], args.gib, args.work, t))
    print(f"the log's appends alone: {args.gib:g} GiB of 8 MiB staged batches over T threads into {args.work}, "
          f"{args.reps} reps per arm, alternating\n")
    print("\n".join(table(arms, args.threads, runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
