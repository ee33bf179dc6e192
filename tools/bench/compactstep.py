"""`cowfs compact` then `cowfs gc`, as a user runs them, for the benchmark's stores (the
series of tools/bench/series.py and the compaction workload of tools/bench/compaction.py),
and `cowfs stats --json` / `cowfs fsck --json` read the same way.

TARGET is a mountpoint (the request goes to the daemon) or an unmounted store.
"""
from __future__ import annotations

import errno
import json
import os
import time
from pathlib import Path
from typing import Any

from cowfs.store.log.layout import SEGMENTS_DIR
from tools.harnessutil import run_cowfs

MB = 1e6


def cli_json(*args: str, timeout: float = 3600) -> Any:
    """Run `cowfs ARGS --json` and parse what it printed."""
    return json.loads(run_cowfs(*args, "--json", timeout=timeout).stdout)


def stats(target: Path) -> dict[str, Any]:
    return dict(cli_json("stats", str(target)))


def fsck(target: Path) -> dict[str, Any]:
    """`cowfs fsck --json` (exit 1 when it finds problems: reported, not raised)."""
    r = run_cowfs("fsck", str(target), "--json", check=False, timeout=3600)
    if r.returncode not in (0, 1):
        raise RuntimeError(f"cowfs fsck {target} failed ({r.returncode}): {r.stderr.strip()}")
    return dict(json.loads(r.stdout))


def written_bytes(store: Path) -> int:
    """Bytes of the segment files that hold data: `physical_bytes` (allocated blocks) counts
    the preallocated, never written tail of the head segment too; SEEK_DATA skips it on ext4
    (unwritten extents read as holes), as it skips the holes gc punched."""
    total = 0
    for seg in sorted((store / SEGMENTS_DIR).glob("*.seg")):
        fd = os.open(seg, os.O_RDONLY)
        try:
            end, pos = os.fstat(fd).st_size, 0
            while pos < end:
                try:
                    start = os.lseek(fd, pos, os.SEEK_DATA)
                except OSError as e:
                    if e.errno == errno.ENXIO:  # no data after pos
                        break
                    raise
                pos = os.lseek(fd, start, os.SEEK_HOLE)
                total += pos - start
        finally:
            os.close(fd)
    return total


def compact_and_gc(target: Path) -> dict[str, Any]:
    """`cowfs compact TARGET --json`, then `cowfs gc TARGET --json`, each timed from outside
    (wall seconds, interpreter start included) beside the seconds each reports itself."""
    t = time.perf_counter()
    compact = cli_json("compact", str(target))
    compact_wall = time.perf_counter() - t
    t = time.perf_counter()
    gc = cli_json("gc", str(target))
    gc_wall = time.perf_counter() - t
    return {"compact": compact, "compact_wall_s": compact_wall, "gc": gc, "gc_wall_s": gc_wall}


def compact_MBps(step: dict[str, Any], wall: bool = False) -> float:
    """Bytes of the files the compactor looked at per second of its run (or of the command)."""
    c = step["compact"]
    secs = step["compact_wall_s"] if wall else c["seconds"]
    return c["logical_bytes"] / secs / MB if secs else float("nan")
