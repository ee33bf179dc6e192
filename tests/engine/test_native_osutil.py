"""native/osutil.c: thread names, bytearrays made without zeroing, and pages faulted in
with the GIL released, against what Python itself does."""
from __future__ import annotations

import mmap
import os
import threading

import pytest

from cowfs import _native


def test_name_thread_sets_the_os_name_cut_to_15_bytes() -> None:
    names: list[str] = []

    def named(name: str) -> None:
        _native.name_thread(name)
        names.append(open(f"/proc/self/task/{threading.get_native_id()}/comm").read().strip())

    for name in ("cowfs-chunk", "a-name-longer-than-fifteen", ""):
        t = threading.Thread(target=named, args=(name,))
        t.start()
        t.join()
    assert names[:2] == ["cowfs-chunk", "a-name-longer-t"]
    with pytest.raises(TypeError):
        _native.name_thread(3)


@pytest.mark.parametrize("n", [0, 1, 4095, 4096, 3 << 20])
def test_uninit_bytearray_is_a_writable_bytearray_of_n_bytes(n: int) -> None:
    b = _native.uninit_bytearray(n)
    assert type(b) is bytearray and len(b) == n
    b[:] = os.urandom(n)
    assert not _native.bytearray_exported(b)


def test_uninit_bytearray_refuses_a_negative_size() -> None:
    with pytest.raises(ValueError):
        _native.uninit_bytearray(-1)
    with pytest.raises(TypeError):
        _native.uninit_bytearray("1")


@pytest.mark.parametrize("start,stop", [(0, 0), (0, 1), (5, 4097), (4096, 3 * 4096), (0, 9 << 20)])
def test_populate_leaves_the_bytes_as_they_are(start: int, stop: int) -> None:
    data = os.urandom(9 << 20)
    fd = os.memfd_create("populate")
    try:
        os.write(fd, data)
        m = mmap.mmap(fd, len(data), flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
        with memoryview(m) as view:
            _native.populate(view[start:stop])
            assert view[start:stop] == data[start:stop]
        m.close()
    finally:
        os.close(fd)
    _native.populate(b"plain bytes work too")
    with pytest.raises(TypeError):
        _native.populate(7)
    with pytest.raises(BufferError):
        _native.populate(b"read-only", True)


def test_populate_for_writing_keeps_the_bytes_and_the_mapping_writable() -> None:
    fd = os.memfd_create("populate-write")
    try:
        os.ftruncate(fd, 5 << 20)
        m = mmap.mmap(fd, 5 << 20, flags=mmap.MAP_SHARED)
        with memoryview(m) as view:
            _native.populate(view, True)
            assert view[:4096] == bytes(4096) and view[-1] == 0
            view[100:104] = b"abcd"
        m.close()
        assert os.pread(fd, 4, 100) == b"abcd"
    finally:
        os.close(fd)
