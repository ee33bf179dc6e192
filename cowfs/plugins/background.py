"""Saves whose commit follows in the background (issue 34, Checkflow's snapshot-then-offload):
the caller waits only for its bytes to be copied into memfds (host memory), which go to the
daemon part by part as they fill (put.py), so the daemon works on them meanwhile, where the
process has CPUs to spare for that (else all at once when the copy is done); the memfds
are those of earlier saves where the process keeps them (part_memfds.py), so the copy does
not wait for new pages; one thread
per process then waits for the commits, in the order the saves were made, and each save's
future reports its commit (or its error).

Memory is bounded: a save starts only while the saves still in flight hold less than
`limit` bytes, so at most `limit` plus one save's bytes wait in memory. A crash before a
commit loses that save only: the daemon commits a put whole or not at all. The memfds kept
between saves have their own bound (part_memfds.py).
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import BinaryIO, Callable

from .part_memfds import memory_total
from .put import PutStream, write_all

DEFAULT_LIMIT_SHARE = 4  # by default the saves in flight hold at most 1/4 of the memory
OVERLAP_CPUS = 4  # CPUs this process may run on from which a save's parts go to the daemon as they fill


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except OSError:
        return os.cpu_count() or 1


def overlapping_parts() -> bool:
    """Whether a background save sends its parts as they fill, so the daemon cuts and hashes
    one while the caller copies the next, or holds them until the copy is done. The caller's
    copy takes a CPU and the daemon's work on a part up to two more: with fewer than
    OVERLAP_CPUS they share one, and the caller waits longer (on 2 CPUs, 256 MiB: 0.22-0.23 s
    against 0.17-0.19 s with the save sent whole after the copy, which was durable no later:
    docs/benchmarks.md, "The stall, taken apart")."""
    return _cpus() >= OVERLAP_CPUS


class BackgroundPuts:
    """Puts committed by a background thread, in order, with a bound on the bytes in flight."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = limit if limit is not None else memory_total() // DEFAULT_LIMIT_SHARE
        self._cond = threading.Condition()
        self._in_flight = 0  # bytes of the memfds not yet committed
        self._pending: set[Future[bool]] = set()
        self._failed: list[BaseException] = []  # errors of finished saves that `wait` has not raised yet
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="cowfs-save")

    def submit(self, path: str | os.PathLike, fill: Callable[[BinaryIO], None], mode: int = 0o666) -> "Future[bool]":
        """Copy what `fill` writes into memfds now (each part sent to the daemon as it fills),
        and commit it as `path`'s new version in the background. What the kernel refuses at
        the file's open (EROFS, ENOENT, EACCES) is raised here. The future's result is what
        `put` returns; its exception, why the save was not committed (the file then keeps
        its last version)."""
        with self._cond:
            self._cond.wait_for(lambda: self._in_flight < self.limit or self._in_flight == 0)
        stream = PutStream(path, mode, hold=not overlapping_parts())
        write_all(stream, fill)
        try:
            stream.send_last()
        except BaseException:
            stream.abort()
            raise
        size = stream.tell()
        with self._cond:
            self._in_flight += size
        future = self._executor.submit(self._commit, stream, size)
        with self._cond:
            self._pending.add(future)
        future.add_done_callback(self._forget)
        return future

    def _commit(self, stream: PutStream, size: int) -> bool:
        try:
            return stream.wait()
        finally:
            with self._cond:
                self._in_flight -= size
                self._cond.notify_all()

    def _forget(self, future: "Future[bool]") -> None:
        with self._cond:
            self._pending.discard(future)
            error = None if future.cancelled() else future.exception()
            if error is not None:
                self._failed.append(error)

    def wait(self) -> None:
        """Wait until every save submitted so far has finished; then raise the error of the
        first one that failed since the last `wait` (later failures until then are dropped:
        their futures hold them)."""
        with self._cond:
            pending = list(self._pending)
        for future in pending:
            try:
                future.result()
            except BaseException:  # noqa: BLE001 - kept in _failed by _forget, raised below in order
                pass
        with self._cond:
            failed, self._failed = self._failed, []
        if failed:
            raise failed[0]


_saves: BackgroundPuts | None = None
_saves_lock = threading.Lock()


def background_puts() -> BackgroundPuts:
    """The process's background saves (made on first use)."""
    global _saves
    with _saves_lock:
        if _saves is None:
            _saves = BackgroundPuts()
        return _saves
