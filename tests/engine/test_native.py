"""Tests of the cowfs._native C extension."""

import errno
import mmap
import os
import platform
import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cowfs import _native

MiB = 1 << 20
IS_X86_64 = platform.machine() in ("x86_64", "AMD64")


def _cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return None


def test_cpu_flush_instruction():
    insn = _native.cpu_flush_instruction()
    if not IS_X86_64:
        assert insn == "none"
        return
    assert insn in ("clwb", "clflushopt", "clflush")
    flags = _cpu_flags()
    if flags is not None:  # cpuid and the kernel's view must agree
        expected = ("clwb" if "clwb" in flags
                    else "clflushopt" if "clflushopt" in flags
                    else "clflush")
        assert insn == expected


@pytest.fixture
def mapped(tmp_path):
    path = tmp_path / "data"
    size = 3 * mmap.PAGESIZE + 123
    path.write_bytes(b"\0" * size)
    fd = os.open(path, os.O_RDWR)
    m = mmap.mmap(fd, size)
    yield fd, m
    m.close()
    os.close(fd)


def test_persist_mmap(mapped):
    fd, m = mapped
    payload = os.urandom(len(m))
    m[:] = payload
    _native.persist(m, 0, len(m))
    _native.persist(m, 7, 5000)          # unaligned start and end
    _native.persist(m, len(m) - 1, 1)    # last byte
    _native.persist(m, len(m), 0)        # empty range at the end
    assert os.pread(fd, len(m), 0) == payload


def test_persist_other_writable_buffers():
    _native.persist(bytearray(4096), 100, 200)
    _native.persist(memoryview(bytearray(10)), 0, 10)


@pytest.mark.parametrize("offset,length", [
    (-1, 1), (0, -1), (1, 1 << 62), (1 << 62, 1), (0, 1 << 20),
])
def test_persist_out_of_range(mapped, offset, length):
    _, m = mapped
    with pytest.raises(ValueError):
        _native.persist(m, offset, length)


def test_persist_range_just_past_end(mapped):
    _, m = mapped
    with pytest.raises(ValueError):
        _native.persist(m, 1, len(m))
    with pytest.raises(ValueError):
        _native.persist(m, len(m) + 1, 0)


def test_persist_needs_writable_buffer():
    with pytest.raises((TypeError, BufferError)):
        _native.persist(b"read-only bytes", 0, 1)


def test_map_sync_unsupported_on_ordinary_file(mapped):
    fd, m = mapped
    assert _native.map_sync_supported(fd, len(m)) is False


def test_map_sync_errors():
    with pytest.raises(OSError) as exc:
        _native.map_sync_supported(-1, 4096)
    assert exc.value.errno == errno.EBADF
    with pytest.raises(ValueError):
        _native.map_sync_supported(0, 0)


def test_punch_hole(tmp_path):
    path = tmp_path / "blob"
    data = os.urandom(4 * MiB)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
        before = os.fstat(fd)
        try:
            _native.punch_hole(fd, 1 * MiB, 1 * MiB)
        except OSError as e:
            if e.errno == errno.EOPNOTSUPP:
                pytest.skip("filesystem of tmp_path cannot punch holes")
            raise
        os.fsync(fd)
        after = os.fstat(fd)
        assert after.st_size == before.st_size == 4 * MiB   # KEEP_SIZE
        assert after.st_blocks < before.st_blocks
        back = os.pread(fd, 4 * MiB, 0)
    finally:
        os.close(fd)
    assert back[1 * MiB:2 * MiB] == bytes(MiB)
    assert back[:1 * MiB] == data[:1 * MiB]
    assert back[2 * MiB:] == data[2 * MiB:]


def test_punch_hole_bad_fd():
    with pytest.raises(OSError) as exc:
        _native.punch_hole(-1, 0, 4096)
    assert exc.value.errno == errno.EBADF


def test_punch_hole_on_pipe():
    r, w = os.pipe()
    try:
        with pytest.raises(OSError) as exc:
            _native.punch_hole(w, 0, 4096)
        assert exc.value.errno == errno.ESPIPE
    finally:
        os.close(r)
        os.close(w)


def test_bytearray_exported_follows_views():
    b = bytearray(100)
    assert not _native.bytearray_exported(b)
    view = memoryview(b)
    piece = view[10:20]
    view.release()
    assert _native.bytearray_exported(b)  # the slice still refers to it
    piece.release()
    assert not _native.bytearray_exported(b)
    with pytest.raises(TypeError):
        _native.bytearray_exported(b"bytes")


@pytest.mark.parametrize("elem", [1, 2, 4, 8])
def test_sub_zigzag_matches_the_arithmetic_and_add_unzigzag_inverts_it(elem):
    import numpy as np

    it = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}[elem]
    info = np.iinfo(it)
    rng = np.random.default_rng(elem)
    n = 4099  # not a multiple of any vector width
    a = rng.integers(info.min, info.max, n, dtype=it, endpoint=True)
    a[:4] = [info.min, info.max, 0, -1]
    b = rng.integers(info.min, info.max, n, dtype=it, endpoint=True)
    b[:4] = [info.max, info.min, -1, 0]  # differences that wrap both ways
    out = np.empty(n * elem, np.uint8)
    _native.sub_zigzag(a.view(np.uint8), b.view(np.uint8), out, elem)
    d = [(int(x) - int(y) + 2 ** (8 * elem - 1)) % 2 ** (8 * elem) - 2 ** (8 * elem - 1) for x, y in zip(a, b)]
    zig = [(v << 1) if v >= 0 else ((-v) << 1) - 1 for v in d]  # the zigzag map, as numbers
    assert out.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[elem]).tolist() == zig
    _native.add_unzigzag(out, b.view(np.uint8), elem)
    assert out.tobytes() == a.tobytes()


def test_delta_helpers_refuse_bad_sizes():
    buf = bytearray(8)
    with pytest.raises(ValueError, match="element size 3"):
        _native.sub_zigzag(bytes(6), bytes(6), bytearray(6), 3)
    with pytest.raises(ValueError, match="buffers of 8 and 4 bytes"):
        _native.sub_zigzag(bytes(8), bytes(4), buf, 2)
    with pytest.raises(ValueError, match="not a multiple of 4"):
        _native.add_unzigzag(bytearray(6), bytes(6), 4)
    with pytest.raises(TypeError):
        _native.add_unzigzag(bytes(8), bytes(8), 2)  # the destination must be writable


def _crc_table(spans: list[tuple[int, int, int]]) -> bytes:
    return b"".join(struct.pack("=QQII", off, n, crc, 0) for off, n, crc in spans)


def test_crc32_mismatch_matches_zlib_and_names_the_first_bad_span():
    buf = bytearray(os.urandom(300_000))
    spans = [(0, 65536), (65536, 100_000), (165_536, 1), (165_537, 0), (200_000, 100_000)]
    table = _crc_table([(o, n, zlib.crc32(buf[o:o + n])) for o, n in spans])
    assert _native.crc32_mismatch(buf, table) == -1
    assert _native.crc32_mismatch(bytes(buf), table) == -1  # any buffer
    assert _native.crc32_mismatch(buf, b"") == -1
    buf[70_000] ^= 0x10  # inside the second span
    assert _native.crc32_mismatch(buf, table) == 1
    buf[70_000] ^= 0x10
    buf[299_999] ^= 1  # the last byte of the last span
    assert _native.crc32_mismatch(buf, table) == 4


def test_crc32_mismatch_refuses_bad_tables():
    buf = bytes(1000)
    with pytest.raises(ValueError, match="outside the buffer"):
        _native.crc32_mismatch(buf, _crc_table([(0, 10, zlib.crc32(bytes(10))), (990, 11, 0)]))
    with pytest.raises(ValueError, match="24-byte spans"):
        _native.crc32_mismatch(buf, bytes(25))


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=20_000), value=st.integers(0, 2**32 - 1), cut=st.integers(0, 20_000))
def test_crc32_by_isal_is_zlibs_crc32_for_any_bytes_and_start_value(data, value, cut):
    """_native.crc32 (ISA-L) against the reference, zlib.crc32: whole, from a start value,
    chained over two pieces, and from any buffer (bytes, bytearray, memoryview)."""
    assert _native.crc32(data) == zlib.crc32(data)
    assert _native.crc32(data, value) == zlib.crc32(data, value)
    a, b = data[:cut], data[cut:]
    assert _native.crc32(b, _native.crc32(a)) == zlib.crc32(data)
    assert _native.crc32(bytearray(data)) == _native.crc32(memoryview(data)) == zlib.crc32(data)


def test_crc32_of_large_buffers_and_bad_arguments():
    big = os.urandom((5 << 20) + 3)  # past the GIL-release threshold, odd length
    assert _native.crc32(big) == zlib.crc32(big)
    with pytest.raises(TypeError):
        _native.crc32("text")  # type: ignore[arg-type]
    assert _native.crc32(b"x", 2**32 + 5) == zlib.crc32(b"x", 2**32 + 5)  # a start value is taken mod 2**32, as zlib does
