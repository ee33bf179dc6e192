"""A write stream's batches in flight (data/batches.py): the next batch is cut while the one
before it is stored, stores stay in order, and a failure hands back the bytes of the failed
batch and of every batch after it, with the chunker put back where the failed one began."""
from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

import cowfs.store.data.session as session_mod
from cowfs.errors import NoSpace
from cowfs.store import ROOT_INO, Store
from cowfs.store.data.batch_threads import BatchThreads
from cowfs.store.data.batches import IN_FLIGHT, StreamBatches

MiB = 1 << 20


class FakeStream:
    """A chunker whose state is the number of batches cut; stores recorded in order."""

    def __init__(self, fail_store: set[str] = frozenset(), fail_cut: set[str] = frozenset()) -> None:
        self.cut_count = 0
        self.stored: list[str] = []
        self.fail_store, self.fail_cut = fail_store, fail_cut
        self.store_gate: dict[str, threading.Event] = {}
        self.cut_started: dict[str, threading.Event] = {}
        self.restored: list[int] = []
        self.stored_event: dict[str, threading.Event] = {}

    def cut(self, data: str, threads: int) -> str:
        self.cut_started.setdefault(data, threading.Event()).set()
        if data in self.fail_cut:
            raise ValueError(f"cut {data}")
        self.cut_count += 1
        return data

    def store(self, batch: str, threads: int) -> None:
        gate = self.store_gate.get(batch)
        if gate is not None:
            assert gate.wait(30)
        if batch in self.fail_store:
            raise NoSpace(f"store {batch}")
        self.stored.append(batch)
        self.stored_event.setdefault(batch, threading.Event()).set()

    def wait_stored(self, batch: str) -> None:
        assert self.stored_event.setdefault(batch, threading.Event()).wait(30)

    def batches(self, pool: ThreadPoolExecutor) -> StreamBatches:
        return StreamBatches(pool, BatchThreads(4), self.cut, self.store, lambda: self.cut_count,
                             self._restore)

    def _restore(self, state: int) -> None:
        self.restored.append(state)
        self.cut_count = state


@pytest.fixture
def pool():
    with ThreadPoolExecutor(4) as p:
        yield p


def test_the_next_batch_is_cut_while_the_one_before_is_stored(pool) -> None:
    f = FakeStream()
    f.store_gate["a"] = threading.Event()
    b = f.batches(pool)
    b.submit("a")
    assert b.make_room() == (None, [])  # a's cut is done: room for b, though a is not stored
    assert b.room()
    b.submit("b")
    assert f.cut_started.setdefault("b", threading.Event()).wait(30)  # b is cut while a waits to store
    waiting = b.to_wait_for()  # two in flight: a third batch waits for b's cut, then for a
    assert waiting is not None
    if waiting is b._jobs[-1].cut:
        waiting.result(30)
        waiting = b.to_wait_for()
    assert waiting is b._jobs[0].done and not waiting.done() and not b.room()
    f.store_gate["a"].set()
    assert b.make_room() == (None, [])
    b.submit("c")
    assert b.wait() == (None, [])
    assert f.stored == ["a", "b", "c"] and f.cut_count == 3 and not b


def test_stores_stay_in_order_when_a_later_cut_ends_first(pool) -> None:
    f = FakeStream()
    f.store_gate["a"] = threading.Event()
    b = f.batches(pool)
    for name in "abcdef":
        if name == "c":
            f.store_gate["a"].set()
        assert b.make_room() == (None, [])
        b.submit(name)
    assert b.wait() == (None, [])
    assert f.stored == list("abcdef")


def test_a_failed_store_hands_back_its_bytes_and_those_after_it(pool) -> None:
    f = FakeStream(fail_store={"b"})
    f.store_gate["b"] = threading.Event()
    b = f.batches(pool)
    b.submit("a")
    assert b.make_room() == (None, [])
    b.submit("b")
    f.wait_stored("a")
    assert b.make_room() == (None, [])  # b is cut
    b.submit("c")  # cut while b waits at its gate, then it waits for b
    b._jobs[-1].cut.result(30)
    f.store_gate["b"].set()  # b fails
    error, back = b.wait()
    assert isinstance(error, NoSpace) and back == ["b", "c"]
    assert f.stored == ["a"] and f.restored == [1] and f.cut_count == 1  # back where b began
    assert not b and b.room()


def test_a_failed_cut_is_met_by_the_next_make_room(pool) -> None:
    f = FakeStream(fail_cut={"b"})
    b = f.batches(pool)
    b.submit("a")
    assert b.make_room() == (None, [])
    b.submit("b")
    error, back = b.make_room()
    assert isinstance(error, ValueError) and back == ["b"]
    assert f.stored == ["a"] and f.cut_count == 1 and f.restored == [1]


def test_at_most_in_flight_batches_run(pool) -> None:
    f = FakeStream()
    f.store_gate["a"] = threading.Event()
    b = f.batches(pool)
    for name in "ab":
        assert b.make_room() == (None, [])
        b.submit(name)
    b._jobs[-1].cut.result(30)
    assert len(b._jobs) == IN_FLIGHT and not b.room()
    threading.Timer(0.2, f.store_gate["a"].set).start()
    assert b.make_room() == (None, [])  # waited for a
    assert f.stored[:1] == ["a"] and len(b._jobs) < IN_FLIGHT


def test_a_session_whose_first_of_two_batches_fails_loses_nothing(store: Store) -> None:
    """Two batches in flight, the first fails to store (no space for a new segment): the
    write that meets it raises, and the stream is as if neither had run, so the same
    session's commit then stores every byte."""
    batch = session_mod.BATCH
    body = os.urandom(3 * batch + 5 * MiB)
    ino = store.create(ROOT_INO, b"f").ino
    with store.open_session(ino) as s:
        gate = threading.Event()
        real = s.writer.store
        calls = []

        def store_once_failing(cut, threads=1):  # type: ignore[no-untyped-def]
            calls.append(cut.start)
            if len(calls) == 1:
                assert gate.wait(30)
                raise NoSpace("no space left on device")
            return real(cut, threads)

        s.writer.store = store_once_failing  # type: ignore[method-assign]
        s.write(0, body[:batch])  # batch 1: cut, then fails in its store once let go
        s.write(batch, body[batch:2 * batch])  # batch 2: cut, then waits for batch 1
        s.batches._jobs[-1].cut.result(30)
        gate.set()
        with pytest.raises(NoSpace):
            s.write(2 * batch, body[2 * batch:])  # meets the failure before it changes anything
        assert s.stream_pos == 2 * batch and s.pending_len == 2 * batch and not s.stream_extents
        assert s.read(0, 2 * batch) == body[:2 * batch]
        s.write(2 * batch, body[2 * batch:])
        s.commit()
    with store.open_reader(ino) as r:
        assert bytes(r.read(0, len(body) + 1)) == body


def test_a_batch_waiting_to_store_holds_no_worker() -> None:
    """With two workers, one storing the first batch (stuck) and the second batch cut, the
    second does not sit on a worker until the first is stored: other work (another session's
    batch) runs on it meanwhile."""
    with ThreadPoolExecutor(2) as pool:
        f = FakeStream()
        f.store_gate["a"] = threading.Event()
        b = f.batches(pool)
        b.submit("a")
        assert b.make_room() == (None, [])
        b.submit("b")
        b._jobs[-1].cut.result(30)
        other = pool.submit(lambda: "ran")
        assert other.result(10) == "ran"  # without the queued store: a TimeoutError here
        f.store_gate["a"].set()
        assert b.wait() == (None, []) and f.stored == ["a", "b"]


def test_no_second_batch_while_the_workers_are_all_taken(pool) -> None:
    """With as many batches in flight (of every stream) as workers, a stream waits for its
    batch to be stored before it starts the next, as with one batch in flight."""
    f = FakeStream()
    f.store_gate["a"] = threading.Event()
    threads = BatchThreads(2)
    b = StreamBatches(pool, threads, f.cut, f.store, lambda: f.cut_count, f._restore)
    threads.batch_started()  # another stream's batch
    try:
        b.submit("a")
        b._jobs[-1].cut.result(30)
        assert not threads.spare and not b.room()
        assert b.to_wait_for() is b._jobs[0].done
        f.store_gate["a"].set()
        assert b.make_room() == (None, []) and not b  # waited for a to be stored
    finally:
        threads.batch_ended()
    assert threads.spare


def test_a_store_queued_after_the_pool_shut_down_fails_instead_of_hanging() -> None:
    """The batch before it ends after the store's pool was shut down (the daemon stopping):
    queuing the waiting store is refused, so that batch fails and whoever waits wakes."""
    pool = ThreadPoolExecutor(2)
    f = FakeStream()
    f.store_gate["a"] = threading.Event()
    b = f.batches(pool)
    b.submit("a")
    assert b.make_room() == (None, [])
    b.submit("b")
    b._jobs[-1].cut.result(30)  # b is cut and noted on a, which is stuck in its store
    pool.shutdown(wait=False)
    f.store_gate["a"].set()
    with pytest.raises(RuntimeError):  # without the refusal handled: b's done never comes (a timeout)
        b._jobs[-1].done.result(30)
    error, back = b.wait()
    assert isinstance(error, RuntimeError) and back == ["b"] and f.stored == ["a"]
    b.submit("c")  # a batch submitted now fails the same way
    error, back = b.wait()
    assert isinstance(error, RuntimeError) and back == ["c"]
    pool.shutdown()
