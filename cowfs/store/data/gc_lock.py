"""`GcLock`: the lock between writers and gc. Writers share it (pins, appends and the
registration of their locations, loading a body and holding it); gc and eviction take it
alone, so while they decide, no record is written that is not yet known, and no body is
loaded that is not yet held.

Before it was one exclusive lock, so every append of every stream waited for the others
(docs/design.md, "Dedup, pins and gc_lock"). Both modes are re-entrant per thread, and the
thread that holds it alone may take it shared too (gc's own calls). A thread that holds it
shared must not ask for it alone (that would wait for itself): it raises RuntimeError.
Writers queue behind a thread that waits to take it alone, so gc is not starved by a steady
stream of appends; a thread that holds it shared already takes it again without waiting.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator


class GcLock:
    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._sharers = 0  # threads that hold it shared (outermost holds only)
        self._owner: int | None = None  # the thread that holds it alone
        self._owner_depth = 0
        self._waiting = 0  # threads waiting to take it alone
        self._mine = threading.local()  # this thread's shared depth, and whether it counts in _sharers

    # -- shared ------------------------------------------------------------------------

    @contextmanager
    def shared(self) -> Iterator[None]:
        """Hold it with the other writers (re-entrant; inside a hold alone, too)."""
        self.acquire_shared()
        try:
            yield
        finally:
            self.release_shared()

    def acquire_shared(self) -> None:
        mine = self._mine
        depth = getattr(mine, "depth", 0)
        if depth:
            mine.depth = depth + 1
            return
        me = threading.get_ident()
        with self._cond:
            if self._owner == me:
                mine.depth, mine.counted = 1, False
                return
            while self._owner is not None or self._waiting:
                self._cond.wait()
            self._sharers += 1
        mine.depth, mine.counted = 1, True

    def release_shared(self) -> None:
        mine = self._mine
        depth = getattr(mine, "depth", 0)
        if not depth:
            raise RuntimeError("gc_lock released shared by a thread that does not hold it")
        mine.depth = depth - 1
        if depth > 1 or not mine.counted:
            return
        with self._cond:
            self._sharers -= 1
            if not self._sharers:
                self._cond.notify_all()

    # -- alone (`with gc_lock:`) --------------------------------------------------------

    def acquire(self) -> None:
        me = threading.get_ident()
        with self._cond:
            if self._owner == me:
                self._owner_depth += 1
                return
            if getattr(self._mine, "depth", 0):
                raise RuntimeError("gc_lock taken alone by a thread that holds it shared (it would wait for itself)")
            self._waiting += 1
            try:
                while self._owner is not None or self._sharers:
                    self._cond.wait()
            finally:
                self._waiting -= 1
            self._owner, self._owner_depth = me, 1

    def release(self) -> None:
        with self._cond:
            if self._owner != threading.get_ident():
                raise RuntimeError("gc_lock released by a thread that does not hold it alone")
            self._owner_depth -= 1
            if not self._owner_depth:
                self._owner = None
                self._cond.notify_all()

    def __enter__(self) -> "GcLock":
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
