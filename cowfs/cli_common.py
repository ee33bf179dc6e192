"""What the modules of the `cowfs` command line share: times, progress bars, help texts."""
from __future__ import annotations

import sys
import time
from typing import Callable

TARGET_HELP = "a store directory, or the mountpoint of a mounted store (then the daemon serves the request)"


def fmt_time(ns: int) -> str:
    """UTC ISO 8601 to the second, e.g. 2026-11-22T10:15:00Z."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ns / 1e9))


def progress_bar(label: str, unit: Callable[[int], str] = str) -> Callable[[int, int], None] | None:
    """A progress bar on stderr when it is a terminal (None otherwise: scripts see no bar)."""
    if not sys.stderr.isatty():
        return None
    finished = False

    def show(done: int, total: int) -> None:
        nonlocal finished
        if finished:
            return
        width = 30
        filled = min(width * done // total, width) if total else width
        pct = 100 * done // total if total else 100
        sys.stderr.write(f"\r{label} [{'#' * filled}{'.' * (width - filled)}] {pct:3d}% {unit(done)}/{unit(total)}\x1b[K")
        if done >= total:
            sys.stderr.write("\n")
            finished = True
        sys.stderr.flush()

    return show
