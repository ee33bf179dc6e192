"""`BatchThreads`: how many threads one write batch's native calls may use, and whether a
stream may put a second batch in flight; `named_pool`: a pool whose OS threads carry its
name (per-thread CPU in /proc says which pool used it)."""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Iterator

from ... import _native

MOST = 8  # threads per batch at most: past this the batch's one-thread parts (picking cuts, Python) dominate


class BatchThreads:
    """The store's cores shared among the write batches running now, one core left to the
    FUSE thread: a lone stream's batch is cut, hashed and staged on the idle cores, and as
    more batches run each gets fewer, down to one (the cheapest way: pyfastcdc's loop hashes
    a quarter fewer bytes than the threaded marking; native/cdc.c)."""

    def __init__(self, cores: int, most: int = MOST) -> None:
        if cores < 1 or most < 1:
            raise ValueError("cores and most must be at least 1")
        self._cores = cores
        self._most = most
        self._running = 0
        self._in_flight = 0  # batches submitted and not yet stored, of every stream
        self._lock = threading.Lock()

    @contextmanager
    def share(self) -> Iterator[int]:
        """The threads this batch may use while it runs (counted as running until it ends)."""
        with self._lock:
            self._running += 1
            n = max(1, min(self._most, (self._cores - 1) // self._running))
        try:
            yield n
        finally:
            with self._lock:
                self._running -= 1

    @property
    def running(self) -> int:
        return self._running

    def batch_started(self) -> None:
        with self._lock:
            self._in_flight += 1

    def batch_ended(self) -> None:
        with self._lock:
            self._in_flight -= 1

    @property
    def spare(self) -> bool:
        """Whether fewer batches are in flight than there are workers: only then does a stream
        put a second batch in flight (data/batches.py). With as many streams as workers, a
        second batch per stream only made each batch wait longer between its cut and its
        store, its bytes out of the caches by then (more CPU per GiB)."""
        return self._in_flight < self._cores


def named_pool(name: str, workers: int) -> ThreadPoolExecutor:
    """A ThreadPoolExecutor whose threads are named `name` for the OS too (at most 15 bytes)."""
    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name, initializer=_native.name_thread,
                              initargs=(name,))
