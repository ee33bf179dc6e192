"""`python -m tools.bench.session_stream`: write streams through a store's write sessions
(no FUSE), this tree against others, arms alternating.

    python -m tools.bench.session_stream [--mib 1024] [--streams 1] [--reps 3] [--work /dev/shm] [--code DIR ...]

Each arm runs in its own process with the cowfs of its tree (`--code DIR`: another source
tree, a worktree of an older commit with its extension built): a new store (`file` device)
in --work, then --mib MiB of new random bytes written in 1 MiB writes (the bytes are cut by
content, the costliest case: gear hash and BLAKE3 over every byte) and committed; with
--streams S, S files at once, each by its own thread, --mib MiB in all. It prints
per arm its GiB/s and its process's CPU seconds per GiB (median [min-max]), and the median
of its speed against the first arm's in the same repetition. What it isolates is the
session's own pipeline (batches cut, stored and appended by the chunk workers): the mount
adds the FUSE round trips, and the writer's copies, which share the cores.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from tools.harnessutil import run_in_tree

from .docs import REPO

# defined in every arm script that runs threads (log_appends.py's too): fn(k) on n threads at
# once, then `then()`; returns (wall s, process CPU s), and raises the first thread's error
TIMED_THREADS = r"""
import threading, time


def timed_threads(fn, n, then=lambda: None):
    errors = []

    def run(k):
        try:
            fn(k)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(n)]
    t, c = time.monotonic(), time.process_time()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    then()
    wall, cpu = time.monotonic() - t, time.process_time() - c
    if errors:
        raise errors[0]
    return wall, cpu
"""

ARM = TIMED_THREADS + r"""
import json, os, shutil, sys, tempfile
from pathlib import Path
from cowfs.store import ROOT_INO, Store
mib, work, streams = int(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
root = Path(tempfile.mkdtemp(dir=work, prefix="cowfs-stream-")) / "store"
try:
    Store.init(root, device="file", segment_size=256 << 20)
    store = Store.open(root)
    try:
        data = memoryview(os.urandom(mib << 20))
        per = (len(data) // streams) & ~((1 << 20) - 1)
        inos = [store.create(ROOT_INO, b"f%d" % k).ino for k in range(streams)]

        def stream(k):
            part = data[k * per:(k + 1) * per] if k < streams - 1 else data[k * per:]
            with store.open_session(inos[k]) as s:
                for i in range(0, len(part), 1 << 20):
                    s.write(i, part[i:i + (1 << 20)], borrow=True)
                s.commit()

        wall, cpu = timed_threads(stream, streams)
    finally:
        store.close()
finally:
    shutil.rmtree(root.parent, ignore_errors=True)
print(json.dumps({"gib_s": mib / 1024 / wall, "cpu_s_per_gib": cpu / (mib / 1024)}))
"""


def run_arm(code: Path, mib: int, work: Path, streams: int = 1) -> dict[str, float]:
    return dict(json.loads(run_in_tree(code, ARM, str(mib), str(work), str(streams))))


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]"


def table(arms: list[Path], runs: list[list[dict[str, float]]]) -> list[str]:
    """Markdown rows: per arm, GiB/s and CPU s per GiB (median [min-max]), and the median of
    its speed over the first arm's in the same repetition."""
    out = ["| arm | GiB/s | process CPU s per GiB | speed / first arm (median) |", "| --- | --- | --- | --- |"]
    for arm, mine in zip(arms, runs):
        out.append(f"| {arm} | {arm_cells(mine, runs[0])} |")
    return out


def arm_cells(mine: list[dict[str, float]], first: list[dict[str, float]]) -> str:
    """An arm's cells: GiB/s and CPU s per GiB (median [min-max]), and the median of its speed
    over the first arm's (`first`) in the same repetition."""
    ratio = statistics.median(r["gib_s"] / ref["gib_s"] for r, ref in zip(mine, first))
    return f"{summary([r['gib_s'] for r in mine])} | {summary([r['cpu_s_per_gib'] for r in mine])} | {ratio:.2f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.bench.session_stream", description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=1024, help="bytes written per arm and repetition (default 1024 MiB)")
    ap.add_argument("--streams", type=int, default=1, help="files written at once, a thread each (default 1)")
    ap.add_argument("--reps", type=int, default=3, help="repetitions of every arm, alternating (default 3)")
    ap.add_argument("--work", type=Path, default=Path("/dev/shm"), help="where the stores go (default /dev/shm)")
    ap.add_argument("--code", type=Path, action="append", default=[], help="another source tree to compare")
    args = ap.parse_args(argv)
    if args.mib < 1 or args.reps < 1 or args.streams < 1:
        ap.error("--mib, --streams and --reps must be at least 1")
    if args.mib < args.streams:
        ap.error(f"--mib {args.mib}: at least 1 MiB per stream (--streams {args.streams})")
    if not args.work.is_dir():
        ap.error(f"--work {args.work}: not a directory")
    arms = [REPO, *(c.resolve() for c in args.code)]
    for c in arms[1:]:
        if not (c / "cowfs").is_dir():
            ap.error(f"--code {c}: no cowfs/ there")
    runs: list[list[dict[str, float]]] = [[] for _ in arms]
    for rep in range(args.reps):
        order = list(range(len(arms))) if rep % 2 == 0 else list(range(len(arms)))[::-1]
        for i in order:
            runs[i].append(run_arm(arms[i], args.mib, args.work, args.streams))
    what = "one write stream" if args.streams == 1 else f"{args.streams} write streams at once"
    print(f"{what} through sessions, {args.mib} MiB of random bytes in all in 1 MiB writes, "
          f"{args.reps} reps per arm, alternating\n")
    print("\n".join(table(arms, runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
