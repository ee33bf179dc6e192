"""The `direct` device's segment (O_DIRECT writes of whole blocks, the last partial block held
in memory) against a bytearray: every read sees every write, and after `persist()` the file
itself, read through a separate descriptor, holds exactly those bytes."""
from __future__ import annotations

import errno
import os
from pathlib import Path

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule

from cowfs.store.log import device as device_mod
from cowfs.store.log.buffers import BufferPool, staging_pool, window_pool
from cowfs.store.log import log as log_mod
from cowfs.store.log.device import BLOCK, DirectFileSegment, FileSegment
from cowfs.store.log.pmem import PmemSegment

SIZE = 16 * BLOCK


def on_disk(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def test_direct_descriptor_is_used(tmp_path):
    seg = DirectFileSegment.create(tmp_path / "s.seg", SIZE)
    try:
        assert seg.dfd >= 0, "O_DIRECT refused on the test filesystem: the direct path is not tested"
        flags = int(open(f"/proc/self/fdinfo/{seg.dfd}").read().split("flags:")[1].split()[0], 8)
        assert flags & os.O_DIRECT
    finally:
        seg.close()


def test_appends_hold_only_the_last_partial_block(tmp_path):
    path = tmp_path / "s.seg"
    seg = DirectFileSegment.create(path, SIZE)
    try:
        first = os.urandom(BLOCK + 100)
        seg.write_parts(0, [first[:10], first[10:]])
        # the whole first block is on the device, the 100 bytes after it are held
        assert on_disk(path)[:BLOCK] == first[:BLOCK]
        assert on_disk(path)[BLOCK:BLOCK + 100] == bytes(100)
        second = os.urandom(300)
        seg.write(BLOCK + 100, second)  # continues from the held copy
        assert seg.read(BLOCK, 400) == first[BLOCK:] + second  # a read sees held bytes
        seg.persist()
        assert on_disk(path)[:BLOCK + 400] == first + second
        assert on_disk(path)[BLOCK + 400:] == bytes(SIZE - BLOCK - 400)
        # continuing after a persist rewrites the block with its first bytes unchanged
        third = os.urandom(BLOCK)
        seg.write(BLOCK + 400, third)
        seg.persist()
        assert on_disk(path)[:2 * BLOCK + 400] == first + second + third
    finally:
        seg.close()


def test_close_writes_the_held_block_and_reopen_continues(tmp_path):
    path = tmp_path / "s.seg"
    seg = DirectFileSegment.create(path, SIZE)
    data = os.urandom(1000)
    seg.write(64, data)
    seg.close()
    assert on_disk(path)[64:1064] == data
    seg = DirectFileSegment.open(path)
    try:
        more = os.urandom(5000)
        seg.write(1064, more)
        seg.persist()
        assert on_disk(path)[64:1064 + 5000] == data + more
        assert on_disk(path)[:64] == bytes(64)
    finally:
        seg.close()


def test_reads_go_through_the_page_cache_after_the_held_block(tmp_path, monkeypatch):
    path = tmp_path / "s.seg"
    seg = DirectFileSegment.create(path, SIZE)
    calls = []
    real = os.preadv
    monkeypatch.setattr(device_mod.os, "preadv", lambda fd, bufs, off: calls.append(fd) or real(fd, bufs, off))
    try:
        data = os.urandom(SIZE - 100)
        seg.write(100, data)  # the last block stays held: the read must write it first
        buf = memoryview(bytearray(SIZE - 150))
        assert seg.read_into(150, [buf[:5], buf[5:]]) == SIZE - 150
        assert bytes(buf) == data[50:]
        assert calls and set(calls) == {seg.fd}
        assert seg.read_into(SIZE - 10, [memoryview(bytearray(9 * BLOCK))]) == 10  # the end of the file
    finally:
        seg.close()


def test_filesystem_refusing_direct_writes_falls_back(tmp_path, monkeypatch):
    path = tmp_path / "s.seg"
    seg = DirectFileSegment.create(path, SIZE)
    real_pwrite = os.pwrite

    def refuse(fd, data, offset):  # type: ignore[no-untyped-def]
        if fd == seg.dfd:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_pwrite(fd, data, offset)

    try:
        monkeypatch.setattr(device_mod.os, "pwrite", refuse)
        data = os.urandom(3 * BLOCK + 7)
        seg.write(0, data)
        assert seg.dfd == -1
        seg.persist()
        assert on_disk(path)[:len(data)] == data
    finally:
        seg.close()


def test_filesystem_without_o_direct_gets_plain_io(tmp_path, monkeypatch):
    real_open = os.open

    def no_direct(path, flags, *mode):  # type: ignore[no-untyped-def]
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *mode)

    monkeypatch.setattr(device_mod.os, "open", no_direct)
    path = tmp_path / "s.seg"
    seg = DirectFileSegment.create(path, SIZE)
    try:
        assert seg.dfd == -1
        data = os.urandom(SIZE - 1000)
        seg.write(500, data)
        seg.persist()
        assert on_disk(path)[500:SIZE - 500] == data
        assert seg.read(500, len(data)) == data
    finally:
        seg.close()


def test_read_only_open_has_no_direct_descriptor(tmp_path):
    path = tmp_path / "s.seg"
    seg = DirectFileSegment.create(path, SIZE)
    data = os.urandom(SIZE)
    seg.write(0, data)
    seg.close()
    seg = DirectFileSegment.open(path, writable=False)
    try:
        assert seg.dfd == -1
        buf = memoryview(bytearray(1000))
        assert seg.read_into(SIZE - 1000, [buf]) == 1000
        assert bytes(buf) == data[-1000:]
    finally:
        seg.close()


def test_buffer_pool_keeps_what_it_may_reuse():
    discarded: list[bytearray] = []
    pool = BufferPool(16, keep=1, make=bytearray, reusable=lambda b: b[0] == 0, discard=discarded.append)
    a, b = pool.take(), pool.take()
    assert len(a) == 16 and a is not b
    pool.give(a)
    pool.give(b)  # more than `keep`
    assert pool.take() is a and discarded == [b]
    a[0] = 1
    pool.give(a)  # not reusable
    pool.give(bytearray(8))  # wrong size
    assert len(discarded) == 3 and pool.take() is not a
    windows = window_pool(16, keep=2)
    w = windows.take()
    held = memoryview(w)[2:4]
    windows.give(w)  # a view is left: not kept
    assert windows.take() is not w
    held.release()


class DirectSegmentModel(RuleBasedStateMachine):
    """Random writes (mostly appends, some anywhere, as gc's zeroing does), punches, reads,
    persists and reopens, checked against a bytearray."""

    def __init__(self) -> None:
        super().__init__()
        self.seg: DirectFileSegment | None = None

    @initialize(tmp=st.integers(0, 10**9))
    def create(self, tmp: int) -> None:
        self.path = Path(BASE) / f"m{tmp}-{os.getpid()}-{id(self)}.seg"
        self.path.unlink(missing_ok=True)
        self.seg = DirectFileSegment.create(self.path, SIZE)
        assert self.seg.dfd >= 0
        self.model = bytearray(SIZE)
        self.end = 0

    def teardown(self) -> None:
        if self.seg is not None:
            self.seg.close()
            self.path.unlink(missing_ok=True)

    @rule(n=st.integers(1, 3 * BLOCK), pieces=st.integers(1, 4))
    def append(self, n: int, pieces: int) -> None:
        n = min(n, SIZE - self.end)
        if n == 0:
            return
        data = os.urandom(n)
        cut = sorted({0, n, *(k * n // pieces for k in range(1, pieces))})
        assert self.seg is not None
        self.seg.write_parts(self.end, [data[a:b] for a, b in zip(cut, cut[1:])])
        self.model[self.end:self.end + n] = data
        self.end += n

    @rule(off=st.integers(0, SIZE - 1), n=st.integers(1, 2 * BLOCK))
    def write_anywhere(self, off: int, n: int) -> None:
        n = min(n, SIZE - off)
        assert self.seg is not None
        self.seg.write(off, bytes(n))
        self.model[off:off + n] = bytes(n)

    @rule(first=st.integers(0, SIZE // BLOCK - 1), blocks=st.integers(1, 3))
    def punch(self, first: int, blocks: int) -> None:
        off = first * BLOCK
        n = min(blocks * BLOCK, SIZE - off)
        assert self.seg is not None
        self.seg.punch(off, n)
        self.model[off:off + n] = bytes(n)

    @rule(off=st.integers(0, SIZE - 1), n=st.integers(1, 3 * BLOCK))
    def read(self, off: int, n: int) -> None:
        n = min(n, SIZE - off)
        assert self.seg is not None
        assert self.seg.read(off, n) == bytes(self.model[off:off + n])
        buf = memoryview(bytearray(n))
        assert self.seg.read_into(off, [buf[:n // 2], buf[n // 2:]]) == n
        assert bytes(buf) == bytes(self.model[off:off + n])

    @rule()
    def persist(self) -> None:
        assert self.seg is not None
        self.seg.persist()
        assert on_disk(self.path) == bytes(self.model)

    @rule()
    def reopen(self) -> None:
        assert self.seg is not None
        self.seg.close()
        assert on_disk(self.path) == bytes(self.model)
        self.seg = DirectFileSegment.open(self.path)

    @rule()
    def image(self) -> None:
        assert self.seg is not None
        img = self.seg.image()
        try:
            assert bytes(img[:]) == bytes(self.model)
        finally:
            if not isinstance(img, bytes):
                img.close()


BASE = ""


@pytest.fixture
def model_base(tmp_path):
    global BASE
    BASE = str(tmp_path)
    yield tmp_path


@pytest.mark.parametrize("small", [False, True], ids=["default-staging", "two-block-staging"])
def test_direct_segment_matches_a_bytearray(model_base, monkeypatch, small):
    if small:  # writes staged two blocks at a time: full staging buffers are flushed mid-write
        monkeypatch.setattr(device_mod, "WRITE_STAGING", staging_pool(2 * BLOCK, keep=1))
    DirectSegmentModel.TestCase.settings = settings(
        max_examples=40, stateful_step_count=30, deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    DirectSegmentModel.TestCase().runTest()


def test_buffered_segment_class_is_unchanged():
    assert log_mod.segment_class("file") is FileSegment
    assert log_mod.segment_class("direct") is DirectFileSegment
    assert log_mod.segment_class("pmem") is PmemSegment


def test_write_aligned_writes_straight_from_the_callers_buffer(tmp_path):
    """Block-aligned data from a page-aligned buffer goes to the device as it is; anything
    not aligned (offset, length, address) is refused with nothing written."""
    path = tmp_path / "s.seg"
    seg = DirectFileSegment.create(path, SIZE)
    buf = staging_pool(4 * BLOCK, keep=1).take()
    try:
        assert seg.aligned_writes
        head = os.urandom(100)
        seg.write(0, head)  # a held partial block before the aligned write
        data = os.urandom(2 * BLOCK)
        view = memoryview(buf)
        view[:2 * BLOCK] = data
        assert not seg.write_aligned(BLOCK + 64, view[:2 * BLOCK])  # offset
        assert not seg.write_aligned(BLOCK, view[:BLOCK + 64])  # length
        assert not seg.write_aligned(BLOCK, view[64:64 + BLOCK])  # address
        assert not seg.write_aligned(BLOCK, memoryview(bytes(BLOCK)))  # read-only
        assert on_disk(path)[BLOCK:3 * BLOCK] == bytes(2 * BLOCK)
        assert seg.write_aligned(BLOCK, view[:2 * BLOCK])
        assert on_disk(path)[BLOCK:3 * BLOCK] == data  # on the device before any persist
        assert on_disk(path)[:100] == head  # the held block went first
        assert seg.read(0, 3 * BLOCK) == head + bytes(BLOCK - 100) + data
        view.release()
    finally:
        seg.close()


def test_file_segments_have_no_aligned_writes(tmp_path):
    seg = FileSegment.create(tmp_path / "s.seg", SIZE)
    try:
        buf = staging_pool(BLOCK, keep=1).take()
        assert not seg.aligned_writes and not seg.write_aligned(0, memoryview(buf))
        assert on_disk(tmp_path / "s.seg") == bytes(SIZE)
    finally:
        seg.close()
