"""GcLock: writers share it, gc takes it alone; waits are on conditions (events and the
lock's own counters), never on sleeps."""
from __future__ import annotations

import threading

import pytest

from cowfs.store.data.gc_lock import GcLock
from tests.support.consumerutil import wait_for

WAIT = 60.0  # seconds a step may take before the test fails (a busy CI machine)


def _thread(fn) -> threading.Thread:
    t = threading.Thread(target=fn, daemon=True)
    t.start()
    return t


def test_writers_hold_it_at_once() -> None:
    lock = GcLock()
    both_in = threading.Barrier(2, timeout=WAIT)

    def writer() -> None:
        with lock.shared():
            both_in.wait()  # breaks (BrokenBarrierError) unless both are inside together

    ts = [_thread(writer), _thread(writer)]
    for t in ts:
        t.join(WAIT)
    assert not both_in.broken and all(not t.is_alive() for t in ts)


def test_gc_waits_for_the_writers_and_writers_wait_for_gc() -> None:
    lock = GcLock()
    release_writer = threading.Event()
    in_gc = threading.Event()
    order: list[str] = []

    def writer() -> None:
        with lock.shared():
            order.append("writer in")
            release_writer.wait(WAIT)
            order.append("writer out")

    def gc() -> None:
        with lock:
            order.append("gc")
            in_gc.set()

    w = _thread(writer)
    wait_for("the writer in", lambda: order == ["writer in"])
    g = _thread(gc)
    wait_for("gc waiting", lambda: lock._waiting == 1)
    assert not in_gc.is_set()
    release_writer.set()
    g.join(WAIT)
    w.join(WAIT)
    assert order == ["writer in", "writer out", "gc"]

    # and a writer waits while gc holds it
    got = threading.Event()
    with lock:
        t = _thread(lambda: (lock.acquire_shared(), got.set(), lock.release_shared()))
        wait_for("the writer started", t.is_alive)
        assert not got.wait(0.05)  # still held alone: the writer cannot be in
    t.join(WAIT)
    assert got.is_set()


def test_a_waiting_gc_goes_before_new_writers_but_not_before_a_writer_already_in() -> None:
    lock = GcLock()
    release = threading.Event()
    steps: list[str] = []

    def first_writer() -> None:
        with lock.shared():
            steps.append("in")
            release.wait(WAIT)
            with lock.shared():  # re-entered while gc waits: no wait, or it would never end
                steps.append("again")

    def late_writer() -> None:
        with lock.shared():
            steps.append("late")

    def gc() -> None:
        with lock:
            steps.append("gc")

    a = _thread(first_writer)
    wait_for("the first writer in", lambda: steps == ["in"])
    g = _thread(gc)
    wait_for("gc waiting", lambda: lock._waiting == 1)
    late = _thread(late_writer)
    release.set()
    for t in (a, g, late):
        t.join(WAIT)
    assert steps == ["in", "again", "gc", "late"]


def test_gc_takes_it_shared_too_and_again_alone() -> None:
    lock = GcLock()
    with lock:
        with lock.shared():
            with lock:
                pass
    assert lock._owner is None and lock._sharers == 0
    with lock.shared():  # the same thread, once gc let go
        pass


def test_misuse_raises_instead_of_hanging() -> None:
    lock = GcLock()
    with lock.shared():
        with pytest.raises(RuntimeError, match="holds it shared"):
            lock.acquire()
    with pytest.raises(RuntimeError, match="does not hold it"):
        lock.release_shared()
    with pytest.raises(RuntimeError, match="does not hold it alone"):
        lock.release()
    assert lock._sharers == 0 and lock._waiting == 0
