"""FileReader (store/data/reader.py): windows of whole chunks, read ahead, verified when served.

Windows are made small here (WINDOW = 192 KiB, chunks average 64 KiB) so that a file of a
few MiB spans many windows and their borders fall inside chunks."""
from __future__ import annotations

import random
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from cowfs.errors import CorruptData
from cowfs.store import Store
from cowfs.store.data import reader as reader_mod
from cowfs.store.data.reader import FileReader
from cowfs.store.log.layout import segment_path
from cowfs.store.log.log import check_chunk
from tests.support.storeutil import data

SIZE = 3_000_000


@pytest.fixture(autouse=True)
def small_windows(monkeypatch):
    monkeypatch.setattr(reader_mod, "WINDOW", 192 << 10)


def _file(store: Store, name: str = "/f", size: int = SIZE, seed: int = 1) -> tuple[int, bytes]:
    body = data(size, seed)
    return store.write_file(name, body).ino, body


def test_sequential_reads_match_and_cross_window_borders(store):
    ino, body = _file(store)
    for piece in (4096, 100_000, 1 << 20, 333_333):
        with store.open_reader(ino) as r:
            got = bytearray()
            pos = 0
            while pos < r.size:
                chunk = r.read(pos, piece)
                assert len(chunk) == min(piece, r.size - pos)
                got += chunk
                pos += len(chunk)
            assert r.read(r.size, 10) == b""
        assert bytes(got) == body


def test_random_and_out_of_order_reads_match(store):
    ino, body = _file(store)
    rng = random.Random(5)
    with store.open_reader(ino) as r:
        for _ in range(400):
            off = rng.randrange(0, SIZE + 10)
            n = rng.choice([1, 4096, 70_000, 131072, 1 << 20])
            assert r.read(off, n) == body[off:off + n]
        # the kernel's read-ahead: a few READs in flight, answered out of order
        step = 128 << 10
        for base in range(0, SIZE, 4 * step):
            for off in (base + 2 * step, base, base + 3 * step, base + step):
                assert r.read(off, step) == body[off:off + step]


def test_concurrent_readers_of_one_handle(store):
    ino, body = _file(store)
    errors: list[str] = []
    with store.open_reader(ino) as r:
        def reader(start: int) -> None:
            for off in range(start, SIZE, 4 * (64 << 10)):
                if r.read(off, 64 << 10) != body[off:off + (64 << 10)]:
                    errors.append(f"mismatch at {off}")

        threads = [threading.Thread(target=reader, args=(k * (64 << 10),)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors


def test_cached_and_fetch_serve_without_waiting(store):
    """What the FUSE thread does: `cached`, or `fetch` + wait + `cached`."""
    ino, body = _file(store)
    with store.open_reader(ino) as r:
        pos = 0
        served_from_windows = 0
        while pos < SIZE:
            n = 100_000
            got = r.cached(pos, n)
            if got is None:
                loading = r.fetch(pos, n)
                assert loading is not None  # sequential reads are served from windows
                for f in loading:
                    f.result(timeout=10)
                got = r.cached(pos, n)
            else:
                served_from_windows += 1
            assert got is not None and bytes(got) == body[pos:pos + n]
            pos += n
        assert served_from_windows > 0  # read ahead: most pieces were loaded before they were asked for
        assert r.fetch(1_000_000, 10) is None  # a jump back is not served from windows
        assert r.read(1_000_000, 10) == body[1_000_000:1_000_010]


def _sparse_file(store: Store) -> int:
    """100,000 bytes, a hole to 1,500,000, b"tail", a hole to 2,000,000."""
    f = store.write_file("/sparse", data(100_000, 3))
    with store.open_session(f.ino) as w:
        w.truncate(2_000_000)
        w.write(1_500_000, b"tail")
        w.commit()
    return f.ino


def test_holes_read_as_zeros(store):
    ino = _sparse_file(store)
    want = data(100_000, 3) + bytes(1_400_000) + b"tail" + bytes(500_000 - 4)
    with store.open_reader(ino) as r:
        assert bytes(r.read(0, r.size)) == want
        for off in range(0, r.size, 150_000):
            assert r.read(off, 150_000) == want[off:off + 150_000]


def _chunk_rows(store: Store, ino: int) -> list[tuple[int, int, int, int]]:
    """(file offset, length, segment, record offset) of the chunks of a file's current version."""
    return store.catalog.reader().execute(
        "SELECT e.file_offset, e.length, c.seg_id, c.offset FROM extents e JOIN chunks c ON c.cid = e.cid"
        " WHERE e.content_id = ? ORDER BY e.file_offset", (store.getattr(ino).content_id,)).fetchall()


def _flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))


@pytest.mark.parametrize("where", ["payload", "header"])
def test_a_damaged_chunk_fails_only_reads_that_touch_it(store_path, where):
    with Store.open(store_path) as s:
        ino, body = _file(s)
        rows = _chunk_rows(s, ino)
    victim = rows[len(rows) // 2]
    v_off, v_len, seg, rec = victim
    _flip(segment_path(store_path, seg), rec + (64 + 100 if where == "payload" else 20))
    with Store.open(store_path) as s:
        for piece in (64 << 10, 1 << 20):
            with s.open_reader(ino) as r:
                pos = 0
                failed = []
                while pos < SIZE:
                    try:
                        assert r.read(pos, piece) == body[pos:pos + piece]
                    except CorruptData as e:
                        assert e.ino == ino and e.vid is not None
                        failed.append(pos)
                    pos += piece
            # exactly the pieces that overlap the damaged chunk failed
            assert failed == [p for p in range(0, SIZE, piece) if p < v_off + v_len and v_off < p + piece]
        with s.open_reader(ino) as r:  # a jump straight onto it fails too, and reads beside it do not
            with pytest.raises(CorruptData):
                r.read(v_off + 10, 10)
            assert r.read(0, 1000) == body[:1000]
        # leave the store clean for the fixture's fsck
        s.fsck(repair=True)


def test_close_keeps_the_version_until_a_read_ahead_in_flight_ends(store):
    ino, body = _file(store)
    attr = store.getattr(ino)
    gate = threading.Event()
    entered = threading.Event()
    released: list[float] = []

    def slow_read_run(seg: int, offset: int, items: list, verify: bool = True) -> None:
        entered.set()
        gate.wait(10)
        store.log.read_run(seg, offset, items, verify)

    from cowfs.store.data.content import load_extents
    extents = store.catalog.read(lambda c: load_extents(c, attr.content_id))
    with ThreadPoolExecutor(max_workers=1) as pool:
        r = FileReader(extents, attr.size, slow_read_run, check_chunk, on_close=lambda: released.append(time.monotonic()),
                       prefetch=pool.submit)
        loading = r.fetch(0, 100)
        assert loading is not None
        assert entered.wait(10)
        r.close()
        assert released == []  # the load in flight still reads the version's records
        gate.set()
        for f in loading:
            f.exception(timeout=10)
    assert len(released) == 1


def test_window_buffers_are_reused_and_old_bytes_never_show(store):
    """Pooled window buffers come back with whatever they held: holes and the bytes past the
    last extent must still read as zeros."""
    f = store.write_file("/holes", data(1_000_000, 7))
    with store.open_session(f.ino) as w:  # a hole, more data, and a hole to the end of the file
        w.truncate(1_600_000)
        w.write(1_600_000, data(900_000, 8))
        w.truncate(2_800_000)
        w.commit()
    ino = f.ino
    body = data(1_000_000, 7) + bytes(600_000) + data(900_000, 8) + bytes(300_000)
    with store.open_reader(ino) as r:
        assert any(e.chunk is None for e in r.extents), "no hole extent to test"
    pool = store.window_buffers
    garbage = [bytearray(b"\xee") * pool.size for _ in range(pool.keep)]
    pool._free[:] = list(garbage)
    for _ in range(2):
        with store.open_reader(ino) as r:
            got = bytearray()
            while len(got) < len(body):
                got += r.read(len(got), 65536)
        assert bytes(got) == body
    assert pool._free, "no window buffer came back to the pool"
    assert all(any(b is g for g in garbage) for b in pool._free), "buffers were not reused"


def test_a_slice_still_held_keeps_its_window_buffer(store):
    ino, body = _file(store)
    with store.open_reader(ino) as r:
        first = r.read(0, 4096)
        assert isinstance(first, memoryview)  # served from a window, not copied
        pos = 4096
        while pos < SIZE:  # every window after it is loaded, dropped and recycled
            assert r.read(pos, 65536) == body[pos:pos + 65536]
            pos += 65536
        assert bytes(first) == body[:4096]
        assert all(b is not first.obj for b in store.window_buffers._free)


def test_a_window_recycled_under_a_planned_read_is_read_again(store):
    ino, body = _file(store)
    with store.open_reader(ino) as r:
        assert r.read(0, 10) == body[:10]
        f = r._windows[0]
        with r._lock:  # another reader thread moved on and dropped window 0 meanwhile
            r._drop(r._windows.pop(0))
            r._windows[0] = f
        assert f.result().recycled
        assert r.read(100, 4096) == body[100:4196]


@pytest.mark.parametrize("size", [0, 1, 4096, 150_000, SIZE])
def test_read_into_gives_the_whole_version(store, size):
    """read_into: spans of about WINDOW bytes from chunk starts, loaded on the read-ahead pool at
    once, straight into the destination (a zeroed buffer, as a fresh memfd is)."""
    ino, body = _file(store, size=size, seed=size)
    with store.open_reader(ino) as r:
        dest = bytearray(size)
        r.read_into(memoryview(dest))
        assert bytes(dest) == body
        with pytest.raises(ValueError):
            r.read_into(memoryview(bytearray(size + 1)))


def test_read_into_prepares_each_span_before_filling_it_and_advises_ahead(store, monkeypatch):
    """read_into calls `prepare` on each span's part of the destination, on the thread that
    loads it and before any byte of it is written; the parts cover the destination once; and
    every record run is advised (read ahead) before it is read."""
    ino, body = _file(store)
    advised: list[tuple[int, int, int]] = []
    read: list[tuple[int, int]] = []
    real_advise, real_read_run = store.log.will_need, store.log.read_run
    monkeypatch.setattr(store.log, "will_need", lambda seg, at, n: (advised.append((seg, at, n)),
                                                                       real_advise(seg, at, n)))

    def read_run(seg, at, items, verify=True):
        assert any(s == seg and a <= at < a + n for s, a, n in advised), "read before it was advised"
        read.append((seg, at))
        return real_read_run(seg, at, items, verify)

    monkeypatch.setattr(store.log, "read_run", read_run)
    with store.open_reader(ino) as r:
        dest = bytearray(b"\xff" * SIZE)
        view = memoryview(dest)
        parts: list[int] = []
        lock = threading.Lock()
        threads: set[int] = set()

        def prepare(part: memoryview) -> None:
            assert part.tobytes() == b"\xff" * len(part)  # nothing of the span written yet
            with lock:
                parts.append(len(part))
                threads.add(threading.get_ident())

        r.read_into(view, prepare)
        assert bytes(dest) == body
        assert sum(parts) == SIZE and len(parts) > 4
        assert threading.get_ident() not in threads  # made on the read-ahead pool's threads
    assert read


def test_read_into_a_sparse_file(store):
    with store.open_reader(_sparse_file(store)) as r:
        dest = bytearray(r.size)
        r.read_into(memoryview(dest))
        assert bytes(dest) == bytes(r.read(0, r.size))


def test_read_into_a_damaged_version_raises_and_names_it(store_path):
    with Store.open(store_path) as s:
        ino, _body = _file(s)
        _v_off, _v_len, seg, rec = _chunk_rows(s, ino)[-3]
    _flip(segment_path(store_path, seg), rec + 64 + 100)
    with Store.open(store_path) as s:
        with s.open_reader(ino) as r:
            with pytest.raises(CorruptData) as e:
                r.read_into(memoryview(bytearray(r.size)))
            assert e.value.ino == ino and e.value.__traceback__ is not None
        s.fsck(repair=True)


class HeldLoads:
    """A prefetch pool that starts nothing until `release`: loads submitted ahead are still in
    flight when the reader gets to them, as when each window takes longer to load (decode)
    than to read."""

    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(2)
        self._held: list[tuple[Future, object, tuple]] = []
        self._lock = threading.Lock()

    def submit(self, fn, *args):  # type: ignore[no-untyped-def]
        f: Future = Future()
        with self._lock:
            self._held.append((f, fn, args))
        return f

    def release(self) -> None:
        with self._lock:
            todo, self._held = self._held, []
        for f, fn, args in todo:
            self.pool.submit(self._run, f, fn, args)

    @staticmethod
    def _run(f: Future, fn, args) -> None:  # type: ignore[no-untyped-def]
        try:
            f.set_result(fn(*args))
        except BaseException as e:
            f.set_exception(e)


def _reader(store: Store, ino: int, prefetch, limit: int) -> FileReader:  # type: ignore[no-untyped-def]
    r = store.open_reader(ino)
    return FileReader(r.extents, r.size, store.log.read_run, check_chunk, r.close, prefetch=prefetch,
                      decode=store.log.decode_many, ahead_limit=limit)


def _read_through(r: FileReader, body: bytes, before_wait=lambda: None) -> None:  # type: ignore[no-untyped-def]
    pos, n = 0, 100_000
    while pos < r.size:
        got = r.cached(pos, n)
        if got is None:
            loading = r.fetch(pos, n)
            assert loading is not None
            before_wait()
            for f in loading:
                f.result(timeout=60)
            got = r.cached(pos, n)
        assert got is not None and bytes(got) == body[pos:pos + n]
        pos += n


def test_read_ahead_grows_while_loads_lag_behind_the_reads(store):
    ino, body = _file(store)
    held = HeldLoads()
    waits: list[int] = []
    with _reader(store, ino, held.submit, limit=5) as r:
        assert r.ahead == reader_mod.AHEAD

        def lagging() -> None:  # each wait finds its windows not loaded yet, then lets them load
            waits.append(r.ahead)
            held.release()

        _read_through(r, body, lagging)
        assert r.ahead == 5  # one more window ahead per lagging load, up to the limit
        assert waits[0] == reader_mod.AHEAD and waits[-1] == 5
    held.release()
    held.pool.shutdown()


def test_read_ahead_stays_when_the_loads_keep_up(store):
    ino, body = _file(store)
    with ThreadPoolExecutor(2) as pool:
        def submit(fn, *args):  # type: ignore[no-untyped-def]
            f = pool.submit(fn, *args)
            f.result(timeout=60)  # loaded before the reader gets there
            return f
        with _reader(store, ino, submit, limit=5) as r:
            _read_through(r, body)
            assert r.ahead == reader_mod.AHEAD
