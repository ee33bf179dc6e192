"""`python -m tools.loadtest`: the options, the run from `cowfs init` to the offline check,
and the summary line. What the run does is told in the package's docstring (__init__.py)."""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cowfs.mountinfo import daemon_pid, lazy_unmount, mounted_cowfs, process_alive
from cowfs.units import human_bytes
from tools.harnessutil import run_cowfs

from . import __doc__ as OVERVIEW
from .controller import Controller
from .errors import LoadError, cowfs_or_fail
from .verify import verify_offline
from .writer import WriterConfig, result_path, writer_process


@dataclass
class Outcome:
    """The counts of the summary line."""
    checkpoints: int = 0
    bytes_verified: int = 0
    snapshots: int = 0
    gc_runs: int = 0
    fsck: str = "not run"


@dataclass
class WriterResults:
    """What the writers left: their errors, every file's last committed version (path ->
    sha256), and the writers whose last versions are unknown because they failed."""
    errors: list[str]
    files: dict[str, str]
    failed: set[str]


def start_writers(args: argparse.Namespace, mnt: Path, workdir: Path, deadline: float,
                  stop: Any) -> list[multiprocessing.Process]:
    import safetensors.torch  # noqa: F401 - imported before the fork, shared by every writer
    import torch  # noqa: F401

    ctx = multiprocessing.get_context("fork")
    procs = []
    for j in range(args.procs):
        (mnt / f"w{j}").mkdir()
        cfg = WriterConfig(j, args.procs, mnt, workdir, args.seed, deadline, args.max_checkpoints)
        p = ctx.Process(target=writer_process, args=(cfg, stop), name=f"loadtest-w{j}")
        p.start()
        procs.append(p)
    return procs


def stop_writers(procs: list[multiprocessing.Process], stop: Any, grace: float) -> list[str]:
    """Ask the writers to stop; SIGKILL (by pid) any still running after `grace` seconds."""
    stop.set()
    errors = []
    end = time.monotonic() + grace
    for p in procs:
        p.join(max(0.0, end - time.monotonic()))
        if p.is_alive():
            errors.append(f"writer {p.name} (pid {p.pid}) did not stop; killed")
            os.kill(p.pid, signal.SIGKILL)
            p.join(10)
    return errors


def collect_results(workdir: Path, procs: list[multiprocessing.Process], out: Outcome) -> WriterResults:
    results = WriterResults([], {}, set())
    for j, p in enumerate(procs):
        path = result_path(workdir, j)
        if not path.exists():
            results.errors.append(f"w{j} left no result (exit code {p.exitcode})")
            results.failed.add(f"w{j}")
            continue
        r = json.loads(path.read_text())
        results.errors += r["errors"]
        if r["errors"]:
            results.failed.add(f"w{j}")  # its last version is unknown: its live files are not compared
        results.files.update(r["files"])
        out.checkpoints += r["stats"].get("checkpoints", 0)
        out.bytes_verified += r["stats"].get("bytes_verified", 0)
    return results


def unmount(mnt: Path, pid: int | None) -> list[str]:
    """`cowfs umount`, a lazy unmount if that failed, and wait for the daemon (`pid`, ours) to end."""
    errors = []
    if str(mnt) in mounted_cowfs():
        try:
            cowfs_or_fail("umount", str(mnt))
        except (LoadError, subprocess.TimeoutExpired) as e:
            errors.append(f"umount: {e}")
    if str(mnt) in mounted_cowfs():
        lazy_unmount(mnt)
    if pid is None:
        return errors + [f"no daemon pid in the lock file of the store mounted on {mnt}"]
    deadline = time.monotonic() + 30
    while process_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if process_alive(pid):
        errors.append(f"the daemon (pid {pid}) still runs after umount; killed")
        os.kill(pid, signal.SIGKILL)
    return errors


def load_while_mounted(args: argparse.Namespace, mnt: Path, workdir: Path, ctl: Controller,
                       out: Outcome) -> tuple[WriterResults, list[str]]:
    """The writers and the controller until the writers are done, then the final snapshot,
    the live tree through the mount and a last gc. The caller unmounts, also on an error.
    Returns what the writers left, and every error so far but the controller's own."""
    stop = multiprocessing.get_context("fork").Event()
    procs: list[multiprocessing.Process] = []
    errors: list[str] = []
    try:
        deadline = time.monotonic() + args.seconds
        procs = start_writers(args, mnt, workdir, deadline, stop)
        ctl.start()
        while any(p.is_alive() for p in procs) and time.monotonic() < deadline + args.grace:
            time.sleep(0.1)
        errors += stop_writers(procs, stop, grace=10)
        ctl.join()
        results = collect_results(workdir, procs, out)
        errors += results.errors
        ctl.attempt("final snapshot", lambda: ctl.snapshot("final"))
        ctl.attempt("live tree", lambda: ctl.check_live_tree(results.files, results.failed))
        ctl.attempt("final gc", ctl.gc)
    finally:
        if procs:
            errors += stop_writers(procs, stop, grace=10)
        ctl.join()
    return results, errors


def fsck(store: Path) -> tuple[str, list[str]]:
    """`cowfs fsck --json` of the unmounted store: the summary's word on it, and the error if any."""
    r = run_cowfs("fsck", str(store), "--json", check=False, timeout=600)
    clean = r.returncode == 0 and json.loads(r.stdout or "{}").get("clean") is True
    if clean:
        return "fsck clean", []
    return (f"fsck FAILED (exit {r.returncode})",
            [f"cowfs fsck {store} exited {r.returncode}: {(r.stdout + r.stderr).strip()}"])


def run(args: argparse.Namespace, workdir: Path) -> tuple[Outcome, list[str]]:
    store, mnt = workdir / "store", workdir / "mnt"
    out = Outcome()
    errors: list[str] = []
    cowfs_or_fail("init", str(store), "--segment-size", "16M")
    mnt.mkdir()
    cowfs_or_fail("mount", str(store), str(mnt))
    pid = daemon_pid(store)
    try:
        ctl = Controller(store, mnt, workdir, args.procs, random.Random(args.seed), args.keep_snapshots,
                         args.snapshot_every, args.gc_every, args.max_snapshots, args.verbose)
        results, load_errors = load_while_mounted(args, mnt, workdir, ctl, out)
        errors += load_errors
    finally:
        errors += unmount(mnt, pid)
    errors += ctl.errors
    out.snapshots, out.gc_runs = ctl.created, ctl.gc_runs + ctl.prunes
    out.bytes_verified += ctl.bytes_verified
    out.fsck, fsck_errors = fsck(store)
    errors += fsck_errors
    try:
        offline, n = verify_offline(store, ctl.live, results.files, results.failed)
        errors += offline
        out.bytes_verified += n
    except Exception as e:  # noqa: BLE001 - reported
        errors.append(f"verifying the unmounted store: {type(e).__name__}: {e}")
    return out, errors


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m tools.loadtest", description=(OVERVIEW or "").split("\n\n")[0])
    ap.add_argument("--procs", type=int, default=8, help="writer processes (default 8)")
    ap.add_argument("--seconds", type=float, default=30, help="how long the writers run (default 30)")
    ap.add_argument("--seed", type=int, default=None, help="random seed (default: random, printed)")
    ap.add_argument("--max-checkpoints", type=int, default=2000, help="per writer: stop after this many writes")
    ap.add_argument("--max-snapshots", type=int, default=1000, help="take at most this many snapshots")
    ap.add_argument("--keep-snapshots", type=int, default=3, help="delete the oldest beyond this many")
    ap.add_argument("--snapshot-every", type=float, default=0.5, metavar="SECONDS",
                    help="pause between the end of one snapshot's check and the next snapshot")
    ap.add_argument("--gc-every", type=float, default=4.0, metavar="SECONDS")
    ap.add_argument("--grace", type=float, default=120.0, metavar="SECONDS",
                    help="writers still running this long after --seconds are an error")
    ap.add_argument("--workdir", help="directory for the store, the mount and the journals (kept)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    ap.add_argument("--verbose", action="store_true", help="print what the controller does and how long it takes")
    args = ap.parse_args(argv)
    if args.procs < 2 or args.seconds <= 0 or args.max_checkpoints < 1 or args.keep_snapshots < 1:
        ap.error("need --procs >= 2, --seconds > 0, --max-checkpoints >= 1, --keep-snapshots >= 1")
    if args.seed is None:
        args.seed = random.randrange(1 << 31)
    return args


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # SIGTERM unwinds like Ctrl-C: the writers stop, the store is unmounted


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    workdir = Path(args.workdir).absolute() if args.workdir else Path(tempfile.mkdtemp(prefix="cowfs-load-"))
    workdir.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, _interrupt)
    print(f"loadtest: seed {args.seed}, {args.procs} procs, {args.seconds:g} s, workdir {workdir}", flush=True)
    try:
        out, errors = run(args, workdir)
    except KeyboardInterrupt:
        print(f"loadtest: interrupted (seed {args.seed}); workdir {workdir}", file=sys.stderr)
        return 130
    except LoadError as e:
        print(f"loadtest: {e}", file=sys.stderr)
        return 1
    for e in errors:
        print(f"ERROR: {e}", file=sys.stderr)
    print(f"load: {args.procs} procs, {out.checkpoints} checkpoints written, {human_bytes(out.bytes_verified)} verified, "
          f"{out.snapshots} snapshots, {out.gc_runs} gc runs, {len(errors)} errors, {out.fsck}", flush=True)
    if errors:
        print(f"loadtest: FAILED (seed {args.seed}); journals and store in {workdir}", file=sys.stderr)
        return 1
    if not args.workdir and not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
