"""`StreamBatches`: the batches of one write stream in flight, one being cut while the one
before it is stored.

A batch's work has two steps: its cut (the content-defined cuts or tensor pieces, and the
chunk ids: `_native.cdc_hash_batch`), which takes the stream's chunker and so must follow
the cut before it, and its store (pins, staged records, the append to the log), which must
follow the store before it, so that the stream's extents stay in order. A batch that runs
them back to back leaves the chunker idle while it appends and the append idle while it
cuts: on a lone stream one of them waits for the other every batch. Here batch N + 1 may
start its cut once batch N's cut is done, and stores once batch N has stored (docs/design.md
section 3, "Batches in flight"). Only while the store's workers outnumber the batches in
flight (`BatchThreads.spare`): with a stream per worker, every worker is busy already.

Failure: a batch whose cut or store fails fails every batch after it (they wait on it before
storing). `wait` waits for all of them, puts the chunker back where the first failed batch
began, and hands back the bytes of that batch and of those after it, in order, so that the
stream's view is as if none of them had run.
"""
from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Generic, TypeVar

from .batch_threads import BatchThreads

IN_FLIGHT = 2  # batches of one stream at once: one cut while the one before it is stored

D = TypeVar("D")  # a batch's bytes, as the session holds them
B = TypeVar("B")  # a cut batch
S = TypeVar("S")  # the chunker's state


class _Job(Generic[D, S]):
    __slots__ = ("data", "saved", "cut", "done", "then")

    def __init__(self, data: D, saved: S) -> None:
        self.data = data
        self.saved = saved  # the chunker before this batch's cut
        self.cut: Future[None] = Future()  # done when the chunker is free again (cut well or not)
        self.done: Future[None] = Future()  # done when the batch is stored, or failed
        # the next batch, cut, and its cut batch: its store is queued when this one is done
        # (kept here, not as a callback of `done`, which would keep every batch of the stream)
        self.then: tuple[_Job[D, S], Any] | None = None


class StreamBatches(Generic[D, B, S]):
    """Batches of one stream in flight, oldest first. Not thread-safe: its owner (the write
    session, under its lock) calls it; the steps run in `executor`, and a store that must
    wait for the one before it is queued when that one ends, so no worker waits idle."""

    def __init__(self, executor: ThreadPoolExecutor, threads: BatchThreads, cut: Callable[[D, int], B],
                 store: Callable[[B, int], None], state: Callable[[], S], restore: Callable[[S], None]) -> None:
        self._executor = executor
        self._threads = threads
        self._cut = cut
        self._store = store
        self._state = state
        self._restore = restore
        self._jobs: list[_Job[D, S]] = []
        self._lock = threading.Lock()  # a batch's `done` and `then`, set by workers

    def __bool__(self) -> bool:
        return bool(self._jobs)

    def _cut_step(self, job: _Job[D, S], before: _Job[D, S] | None) -> None:
        try:
            with self._threads.share() as threads:
                batch = self._cut(job.data, threads)
        except BaseException as e:  # noqa: BLE001 - the batch's outcome
            job.cut.set_exception(e)
            self._finish(job, e)
            return
        job.cut.set_result(None)
        if before is not None:
            with self._lock:
                if not before.done.done():
                    before.then = (job, batch)  # stored once `before` is (_finish queues it)
                    return
        self._store_step(job, before, batch)

    def _store_step(self, job: _Job[D, S], before: _Job[D, S] | None, batch: B) -> None:
        error = before.done.exception() if before is not None else None
        if error is None:  # else a batch before it failed: this one is not stored either
            try:
                with self._threads.share() as threads:
                    self._store(batch, threads)
            except BaseException as e:  # noqa: BLE001 - the batch's outcome
                error = e
        self._finish(job, error)

    def _finish(self, job: _Job[D, S], error: BaseException | None) -> None:
        """The batch is stored (or failed); the next one's store, if it waits, is queued."""
        with self._lock:
            if error is None:
                job.done.set_result(None)
            else:
                job.done.set_exception(error)
            then, job.then = job.then, None
        if then is not None:
            self._queue(self._store_step, then[0], job, then[1])

    def _queue(self, step: Callable[..., None], job: _Job[D, S], *args: object) -> None:
        try:
            self._executor.submit(step, job, *args)
        except RuntimeError as e:  # the pool was shut down: the batch fails, its waiters wake
            if not job.cut.done():
                job.cut.set_exception(e)
            self._finish(job, e)

    def submit(self, data: D) -> None:
        """Start a batch; call `make_room` first."""
        job: _Job[D, S] = _Job(data, self._state())
        self._threads.batch_started()
        job.done.add_done_callback(lambda _f: self._threads.batch_ended())
        self._queue(self._cut_step, job, self._jobs[-1] if self._jobs else None)
        self._jobs.append(job)

    def _drop_stored(self) -> bool:
        """Forget the oldest batches that stored well; False if the oldest one done failed."""
        while self._jobs and self._jobs[0].done.done():
            if self._jobs[0].done.exception() is not None:
                return False
            self._jobs.pop(0)
        return True

    def _storing(self) -> list[_Job[D, S]]:
        """The batches not yet stored, oldest first (stores end in order: those done lead)."""
        done = 0
        while done < len(self._jobs) and self._jobs[done].done.done():
            done += 1
        return self._jobs[done:]

    def _may_add(self, storing: list[_Job[D, S]]) -> bool:
        return not storing or (len(storing) < IN_FLIGHT and self._threads.spare)

    def room(self) -> bool:
        """Whether a batch could start now without waiting."""
        return not self._jobs or (self._jobs[-1].cut.done() and self._may_add(self._storing()))

    def to_wait_for(self) -> "Future[None] | None":
        """What to await before a batch can start (None: it can now)."""
        if not self._jobs:
            return None
        if not self._jobs[-1].cut.done():
            return self._jobs[-1].cut
        storing = self._storing()
        return None if self._may_add(storing) else storing[0].done

    def make_room(self) -> tuple[BaseException | None, list[D]]:
        """Wait until a batch can start. A failure met on the way is `wait`'s: (the first error,
        the bytes handed back); else (None, [])."""
        if self._jobs:
            try:
                self._jobs[-1].cut.result()
            except BaseException:  # noqa: BLE001 - handed to the caller by wait()
                return self.wait()
        while True:
            if not self._drop_stored():
                return self.wait()
            if self._may_add(self._jobs):
                return None, []
            try:
                self._jobs[0].done.result()
            except BaseException:  # noqa: BLE001 - handed to the caller by wait()
                return self.wait()

    def wait(self) -> tuple[BaseException | None, list[D]]:
        """Wait for every batch in flight. If one failed: the chunker back where the first
        failed batch began, and (its error, the bytes of it and of every batch after it, in
        order); else (None, [])."""
        jobs, self._jobs = self._jobs, []
        failed: int | None = None
        error: BaseException | None = None
        for i, job in enumerate(jobs):
            try:
                job.done.result()
            except BaseException as e:  # noqa: BLE001 - returned to the caller
                if failed is None:
                    failed, error = i, e
        if failed is None:
            return None, []
        self._restore(jobs[failed].saved)
        return error, [job.data for job in jobs[failed:]]
