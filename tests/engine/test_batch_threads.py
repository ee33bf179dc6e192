"""BatchThreads: the cores, less one for the FUSE thread, shared among the batches running."""
from __future__ import annotations

import os
import threading

import pytest

from cowfs.store import ROOT_INO, Store
from cowfs.store.data.batch_threads import BatchThreads
from cowfs.store.data.session import BATCH


def test_a_lone_batch_gets_the_idle_cores_and_more_batches_fewer() -> None:
    t = BatchThreads(9, most=8)
    with t.share() as a:
        assert a == 8 and t.running == 1
        with t.share() as b, t.share() as c:
            assert (b, c) == (4, 2) and t.running == 3
        with t.share() as d:
            assert d == 4
    assert t.running == 0
    with BatchThreads(2).share() as one:
        assert one == 1  # two cores: one for the FUSE thread, one for the batch
    with BatchThreads(1).share() as one:
        assert one == 1


def test_a_failed_batch_is_no_longer_counted() -> None:
    t = BatchThreads(4)
    with pytest.raises(RuntimeError):
        with t.share():
            raise RuntimeError("no space")
    assert t.running == 0


def test_bad_counts_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        BatchThreads(0)


def test_sessions_write_the_same_on_many_threads_as_on_one(tmp_path) -> None:
    """The same bytes through a store whose batches use 5 threads and one whose use 1: the
    same chunks (ids and lengths), and each reads back whole; several sessions at once."""
    data = [os.urandom(2 * BATCH + 12_345) for _ in range(3)]
    extents = []
    for workers in (1, 6):
        Store.init(tmp_path / f"s{workers}")
        with Store.open(tmp_path / f"s{workers}", workers=workers) as s:
            inos = [s.create(ROOT_INO, f"f{i}".encode()).ino for i in range(3)]

            def write(i: int) -> None:
                with s.open_session(inos[i]) as w:
                    for off in range(0, len(data[i]), 1 << 20):
                        w.write(off, data[i][off:off + (1 << 20)])
                    w.commit()

            threads = [threading.Thread(target=write, args=(i,)) for i in range(3)]
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            chunks = []
            for i, ino in enumerate(inos):
                with s.open_reader(ino) as r:
                    assert bytes(r.read(0, len(data[i]))) == data[i]
                    chunks.append([(e.offset, e.length, e.chunk) for e in r.extents])
            extents.append(chunks)
            assert s.fsck().clean
    assert extents[0] == extents[1]


def test_a_borrowed_view_is_kept_and_an_unborrowed_one_copied(store: Store) -> None:
    """WriteSession.write(borrow=True) keeps the caller's read-only view (the put socket's
    memfd pages: no copy); without it the bytes are copied, so changing the caller's buffer
    afterwards changes nothing."""
    data = bytearray(os.urandom(3 << 20))
    ino = store.create(ROOT_INO, b"b").ino
    with store.open_session(ino) as w:
        view = memoryview(bytes(data))
        w.write(0, view, borrow=True)
        assert w.pending[-1] is view
        mutable = memoryview(data)
        w.write(len(view), mutable)
        assert w.pending[-1] is not mutable
        data[:] = bytes(len(data))  # the caller reuses its buffer
        w.commit()
    with store.open_reader(ino) as r:
        assert bytes(r.read(0, 6 << 20)) == bytes(view) * 2


def test_spare_while_fewer_batches_are_in_flight_than_workers() -> None:
    t = BatchThreads(2)
    assert t.spare
    t.batch_started()
    assert t.spare
    t.batch_started()
    assert not t.spare
    t.batch_ended()
    assert t.spare
