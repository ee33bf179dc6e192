"""`python -m tools.bench.profile`: where the daemon's time goes during one big torch.save.

Mounts a new store, starts py-spy (sampling, --nonblocking so the daemon is never
ptrace-stopped) on the daemon, saves a state dict of random fp32 tensors through the
mount (torch.save + fsync + close), stops py-spy, and prints:
  * CPU seconds per daemon thread (utime/stime from /proc/PID/task/*/stat, before/after);
  * py-spy samples by category (the first matching frame from the leaf up), per thread.
The raw py-spy file (collapsed stacks) is kept in --out for a flamegraph.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator

from cowfs.store.log.layout import DEFAULT_DEVICE, DEVICES

from .docs import REPO
from .extras import synthetic_state_dict
from .mounting import drop_caches, init_store, mounted, thread_times
from .savers import cowfs_torch
from .series import read_file

# (category, substrings of a frame); the first rule matching a frame, searching from the leaf up, wins
RULES: list[tuple[str, tuple[str, ...]]] = [
    ("idle: waiting for work or for the kernel", ("EpollIOManager.get_events", "thread.py:81)", "Condition.wait",
                                                 "SimpleQueue", "Queue.get", "_wait_fuse_readable")),
    ("fdatasync of the log (Log.sync)", ("Log.sync",)),
    ("log append: pwrite into the segment", ("FileSegment.write", "FileSegment._write_direct")),
    ("log append: record encoding + CRC32", ("encode_record", "record_parts", "stage_records")),
    ("log append: other", ("Log.append",)),
    ("hashing: BLAKE3 per chunk", ("chunk_id (",)),
    ("chunking: FastCDC cut + BLAKE3 per batch (native)", ("StreamChunker.cut", "cdc_hash_batch")),
    ("dedup: pin + catalog lookup", ("ChunkIndex.pin",)),
    ("SQLite: catalog transaction", ("Catalog.", "cowfs-catalog")),
    ("commit: materialize (last batch)", ("_materialize",)),
    ("FUSE write handler: out-of-order write, spill file (Overlay.write)", ("Overlay.write",)),
    ("FUSE write handler: copy into the session buffer", ("CowfsOperations.write",)),
    ("read: BLAKE3 verify (check_chunk)", ("check_chunk",)),
    ("read: preadv from the segment", ("FileSegment.read_into", "FileSegment.read ")),
    ("read: record header checks", ("decode_record_header", "Log.read_run")),
    ("read: windows and reply slices", ("FileReader.", "Window.", "read_window", "record_runs")),
    ("other FUSE handlers", ("cowfs/fs/operations.py",)),
    ("pyfuse3 / trio request loop", ("_pyfuse3", "trio/")),
]

IDLE_LEAVES = ("Catalog._run ", "WorkerThread._work ", "_worker (concurrent/futures/thread.py")


def thread_cpu(pid: int) -> dict[str, tuple[float, float]]:
    """thread name (+tid) -> (user s, system s)."""
    return {f"{name} [{tid}]": (user, system) for tid, (name, user, system) in thread_times(pid).items()}


def categorize(raw: Path) -> tuple[collections.Counter[str], dict[str, collections.Counter[str]]]:
    total: collections.Counter[str] = collections.Counter()
    per_thread: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        frames = stack.split(";")
        thread = frames[0].split(": ", 1)[-1] if frames[0].startswith("thread") else "?"
        thread = thread.rstrip("_0123456789") or thread  # cowfs-chunk_0 and _1 together
        cat = "other"
        if frames[-1].startswith(IDLE_LEAVES):  # a loop blocked in C (SimpleQueue.get, epoll)
            frames = frames[:-1] + ["Condition.wait"]
        for frame in reversed(frames):
            hit = next((c for c, subs in RULES if any(s in frame for s in subs)), None)
            if hit:
                cat = hit
                break
        total[cat] += int(count)
        per_thread[thread][cat] += int(count)
    return total, per_thread


@contextlib.contextmanager
def py_spy(args: argparse.Namespace, pid: int, raw: Path) -> Iterator[None]:
    """py-spy samples `pid` for the body (never ptrace-stopping it: --nonblocking), then detaches."""
    cmd = [args.py_spy, "record", "--pid", str(pid), "--format", "raw", "-o", str(raw), "--threads",
           "--nonblocking", "-r", str(args.rate)] + (["--idle"] if args.idle else [])
    spy = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        time.sleep(1.0)
        yield
    finally:
        spy.send_signal(signal.SIGINT)  # py-spy writes its file and detaches
        try:
            spy.wait(60)
        except subprocess.TimeoutExpired:
            spy.kill()
            spy.wait()


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m tools.bench.profile", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mib", type=int, default=1024, help="size of the state dict (default 1024 MiB)")
    p.add_argument("--dir", default="/var/tmp")
    p.add_argument("--out", default=str(REPO / "bench-results"))
    p.add_argument("--py-spy", default=shutil.which("py-spy") or "/tmp/pyspy/bin/py-spy")
    p.add_argument("--rate", type=int, default=100)
    p.add_argument("--idle", action="store_true", help="also sample threads that wait (wall-clock view)")
    p.add_argument("--no-writeback", action="store_true", help="mount with the kernel's writeback cache off")
    p.add_argument("--read", action="store_true", help="profile a cold sequential read from a fresh mount instead")
    p.add_argument("--device", default=DEFAULT_DEVICE, choices=DEVICES, help="the store's device (cowfs init --device)")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    kind = ("read" if args.read else "save") + ("-wall" if args.idle else "-cpu") + ("-nowb" if args.no_writeback else "")
    raw = out / f"profile-{kind}-{time.strftime('%Y%m%d-%H%M%S')}.txt"
    sd = synthetic_state_dict(args.mib << 20)
    work = Path(tempfile.mkdtemp(prefix="bench-prof-", dir=args.dir))
    try:
        store = init_store(work / "store", device=args.device)
        with mounted(store, work / "mnt", writeback=not args.no_writeback) as m:
            if args.read:
                r = cowfs_torch(sd, m.mnt / "model.pt")
        with mounted(store, work / "mnt", writeback=not args.no_writeback) as m:
            with py_spy(args, m.pid, raw):
                cpu0 = thread_cpu(m.pid)
                if args.read:
                    drop_caches()
                    secs = read_file(m.mnt / "model.pt")
                    headline = (f"cold sequential read (4 MiB reads) of {r.bytes / 2**20:.0f} MiB from a fresh mount: "
                                f"{secs:.2f} s ({r.bytes / secs / 1e6:.0f} MB/s)\n")
                else:
                    r = cowfs_torch(sd, m.mnt / "model.pt", probe=m.spilled)
                    secs = r.seconds
                    headline = (f"torch.save + fsync + close of {r.bytes / 2**20:.0f} MiB through the mount: {r.seconds:.2f} s "
                                f"({r.bytes / r.seconds / 1e6:.0f} MB/s), of which fsync + close {r.durable_seconds:.2f} s; "
                                f"{(r.spilled or 0) / 2**20:.0f} MiB had arrived out of order (in the spill file) before fsync\n")
                cpu1 = thread_cpu(m.pid)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(headline)
    print("| daemon thread | user s | system s |\n|---|---|---|")
    tu = ts = 0.0
    for name, (u1, s1) in sorted(cpu1.items()):
        u0, s0 = cpu0.get(name, (0.0, 0.0))
        if u1 - u0 + s1 - s0 > 0:
            print(f"| {name} | {u1 - u0:.2f} | {s1 - s0:.2f} |")
            tu, ts = tu + u1 - u0, ts + s1 - s0
    print(f"| all | {tu:.2f} | {ts:.2f} |  ({(tu + ts) / (r.bytes / 2**30):.2f} CPU s per GiB)\n")
    del secs
    total, per_thread = categorize(raw)
    n = sum(total.values()) or 1
    print(f"py-spy: {n} samples at {args.rate} Hz ({'every thread, waiting included' if args.idle else 'threads on the CPU or in a syscall'}):\n")
    print("| where | samples | % |\n|---|---|---|")
    for cat, c in total.most_common():
        print(f"| {cat} | {c} | {100 * c / n:.1f} |")
    print("\nper thread:")
    for thread, cats in sorted(per_thread.items(), key=lambda kv: -sum(kv[1].values())):
        tn = sum(cats.values())
        print(f"  {thread}: {tn} samples: " + "; ".join(f"{c} {100 * k / tn:.0f}%" for c, k in cats.most_common(6)))
    print(f"\nraw stacks: {raw}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
