"""The FUSE thread serves every file, so it never blocks on one file's batch: a write that
would wait for its session's batches in flight (`WriteSession.batch_to_wait_for`: the last
one's cut, or the oldest of two) is awaited in trio first (`CowfsOperations.write`), and
other requests are served meanwhile."""
from __future__ import annotations

import os
import threading
from types import SimpleNamespace

import trio
import trio.testing

import cowfs.store.data.session as session_mod
from cowfs.fs.handles import SharedSession
from cowfs.fs.operations import CowfsOperations
from cowfs.store import ROOT_INO, Store

MiB = 1 << 20


class StuckBatches:
    """Makes a session's batches wait for `release` before they are stored."""

    def __init__(self, session: session_mod.WriteSession) -> None:
        self.release = threading.Event()
        self.started = threading.Event()
        real = session.writer.store

        def store(batch, threads=1):  # type: ignore[no-untyped-def]
            self.started.set()
            self.release.wait(60)
            return real(batch, threads)

        session.writer.store = store  # type: ignore[method-assign]


def _read(store: Store, ino: int) -> bytes:
    attr = store.getattr(ino)
    with store.open_reader(ino) as r:
        return bytes(r.read(0, attr.size + 1))


def _both_cut(s: session_mod.WriteSession) -> None:
    """Wait until the last batch in flight has been cut (it then waits for the one before)."""
    s.batches._jobs[-1].cut.result(30)


def test_which_writes_would_wait_for_a_batch(store: Store) -> None:
    batch = session_mod.BATCH
    body = os.urandom(2 * batch + 3 * MiB)
    ino = store.create(ROOT_INO, b"f").ino
    with store.open_session(ino) as s:
        stuck = StuckBatches(s)
        assert s.batch_to_wait_for(0, batch) is None  # no batch runs yet
        s.write(0, body[:batch])  # the first batch goes to a worker: cut, then stuck in its store
        assert stuck.started.wait(30)
        assert s.batch_to_wait_for(batch, batch) is None  # its cut is done: the next batch may start
        s.write(batch, body[batch:2 * batch])  # the second: cut, then waits for the first's store
        _both_cut(s)
        assert s.batch_to_wait_for(2 * batch, MiB) is None  # a plain append: it cannot wait
        s.write(2 * batch, body[2 * batch:2 * batch + MiB])
        oldest = s.batch_to_wait_for(2 * batch + MiB, batch)  # it would fill a third batch: two run
        assert oldest is not None and not oldest.done()
        assert s.batch_to_wait_for(MiB, 10) is oldest  # an overwrite leaves the stream: it waits first
        assert s.batch_to_wait_for(2 * batch + 2 * MiB, MiB) is oldest  # held ahead of the stream
        stuck.release.set()
        oldest.result(30)
        assert s.batch_to_wait_for(2 * batch + MiB, batch) is None
        s.write(2 * batch + MiB, body[2 * batch + MiB:])
        s.commit()
    assert _read(store, ino) == body


def test_the_fuse_thread_serves_others_while_a_write_waits_for_its_batch(store: Store) -> None:
    """Without the wait in trio, the write blocks the trio thread until the batch is done,
    and the other task sees the write finished already (the batch is then let go by a
    fallback timer, so the test fails instead of hanging)."""
    batch = session_mod.BATCH
    body = os.urandom(3 * batch)
    ino = store.create(ROOT_INO, b"g").ino
    ops = CowfsOperations(store)
    with store.open_session(ino) as s:
        stuck = StuckBatches(s)
        s.write(0, body[:batch])
        assert stuck.started.wait(30)
        s.write(batch, body[batch:2 * batch])  # two batches in flight, the first stuck
        _both_cut(s)
        ops.handles.files[7] = SimpleNamespace(shared=SharedSession(s))  # type: ignore[assignment]
        seen: dict[str, bool] = {}
        fallback = threading.Timer(10, stuck.release.set)
        fallback.start()

        async def main() -> None:
            done = trio.Event()

            async def write() -> None:
                assert await ops.write(7, 2 * batch, body[2 * batch:]) == batch
                done.set()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(write)
                await trio.testing.wait_all_tasks_blocked()  # the write waits for the stuck batch (or has blocked the thread and finished)
                seen["served while the write waited"] = not done.is_set()
                stuck.release.set()
                await done.wait()

        try:
            trio.run(main)
        finally:
            fallback.cancel()
            stuck.release.set()
        assert seen == {"served while the write waited": True}
        s.commit()
    assert _read(store, ino) == body


def test_a_write_whose_joins_fill_another_batch_does_not_wait_for_it(store: Store, monkeypatch) -> None:
    """The write that closes the gap before held writes joins them all. The FUSE thread awaited
    room for a batch before it; the batches that write starts must not be waited for by the
    joins (the writeback cache's order made the FUSE thread block so in a profile)."""
    monkeypatch.setattr(session_mod, "BATCH", MiB)
    body = os.urandom(6 * MiB)
    ino = store.create(ROOT_INO, b"h").ino
    with store.open_session(ino) as s:
        stuck = StuckBatches(s)
        s.write(0, body[:MiB])  # batch 1 runs, stuck in its store
        assert stuck.started.wait(30)
        for k in (2, 3, 4, 5):  # held ahead of the stream
            s.write(k * MiB, body[k * MiB:(k + 1) * MiB])
        assert s.batch_to_wait_for(MiB, MiB) is None  # batch 1 is cut: there is room for batch 2
        writer = threading.Thread(target=s.write, args=(MiB, body[MiB:2 * MiB]))
        writer.start()
        writer.join(10)
        returned = not writer.is_alive()
        stuck.release.set()
        writer.join(30)
        assert returned and s.stream_pos == 6 * MiB
        s.commit()
    assert _read(store, ino) == body


def test_a_write_waiting_for_its_batch_keeps_the_later_ones_behind_it(store: Store, monkeypatch) -> None:
    """WRITEs of one file go in the order they arrived: when the running batch is done, the
    write that waited for it goes before those that arrived after it (trio wakes waiters in
    either order), so none is held ahead of the stream (with many such, the reorder window
    filled and a writeback-cached save under load left the fast path). Ten rounds: trio
    wakes the waiters in either order, so without the order some round applies a later write
    first."""
    monkeypatch.setattr(session_mod, "BATCH", MiB)  # every 1 MiB write fills a batch
    for round_ in range(10):
        body = os.urandom(5 * MiB)
        ino = store.create(ROOT_INO, f"k{round_}".encode()).ino
        ops = CowfsOperations(store)
        with store.open_session(ino) as s:
            stuck = StuckBatches(s)
            s.write(0, body[:MiB])  # the first batch, stuck
            assert stuck.started.wait(30)
            ops.handles.files[7] = SimpleNamespace(shared=SharedSession(s))  # type: ignore[assignment]
            held: list[int] = []
            real = s.write

            def write(offset, data, borrow=False):  # type: ignore[no-untyped-def]
                n = real(offset, data, borrow)
                held.append(s.ahead_len)
                return n

            s.write = write  # type: ignore[method-assign]
            fallback = threading.Timer(10, stuck.release.set)
            fallback.start()

            async def main() -> None:
                async with trio.open_nursery() as nursery:
                    for k in range(1, 5):  # each fills the next batch or would be held: all wait
                        nursery.start_soon(ops.write, 7, k * MiB, body[k * MiB:(k + 1) * MiB])
                        await trio.testing.wait_all_tasks_blocked()
                    stuck.release.set()

            try:
                trio.run(main)
            finally:
                fallback.cancel()
                stuck.release.set()
            assert held and max(held) == 0, (round_, held)
            s.commit()
        assert _read(store, ino) == body
