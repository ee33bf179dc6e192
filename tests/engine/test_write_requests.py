"""The size of WRITE requests the mount asks for (cowfs/fs/write_requests.py): the largest that
libfuse can receive by splice into a pipe this process may make."""
from __future__ import annotations

from cowfs.fs.write_requests import HEADER, LIBFUSE_LARGEST, PAGE, SMALLEST, pipe_can_hold, spliced_max_write

MIB = 1 << 20


def _pipes_up_to(limit: int):  # type: ignore[no-untyped-def]
    """A process that may make pipes up to `limit` bytes (the kernel rounds a pipe's size up
    to a power of two of pages)."""
    def can_hold(size: int) -> bool:
        pipe = PAGE
        while pipe < size:
            pipe *= 2
        return pipe <= limit

    return can_hold


def test_libfuses_own_size_when_its_pipe_can_be_made() -> None:
    # fs.pipe-max-size of 2 MiB or more, or CAP_SYS_RESOURCE: libfuse splices 1 MiB requests
    assert spliced_max_write(_pipes_up_to(2 * MIB), 2 * MIB) == 0
    assert spliced_max_write(_pipes_up_to(64 * MIB), MIB) == 0  # a privileged process: the limit does not bind it


def test_one_page_less_than_the_largest_pipe_under_the_limit() -> None:
    assert spliced_max_write(_pipes_up_to(MIB), MIB) == MIB - HEADER == 1020 << 10
    assert spliced_max_write(_pipes_up_to(MIB), 1536 << 10) == MIB - HEADER  # pipes come in powers of two
    assert spliced_max_write(_pipes_up_to(512 << 10), 512 << 10) == (512 << 10) - HEADER
    assert spliced_max_write(_pipes_up_to(SMALLEST * 2), SMALLEST * 2) == SMALLEST * 2 - HEADER


def test_libfuses_size_when_splicing_would_take_small_requests() -> None:
    assert spliced_max_write(_pipes_up_to(SMALLEST), SMALLEST) == 0  # 124 KiB: more requests than the copy saves
    assert spliced_max_write(_pipes_up_to(64 << 10), 64 << 10) == 0
    assert spliced_max_write(_pipes_up_to(MIB), None) in (0, MIB - HEADER)  # read from /proc
    assert spliced_max_write(lambda _size: False, MIB) == 0  # no pipe can be made at all


def test_the_size_is_whole_pages_and_never_above_libfuses() -> None:
    for limit in (200 << 10, 300 << 10, MIB, 3 * MIB):
        size = spliced_max_write(_pipes_up_to(limit // 2), limit)
        assert size % PAGE == 0 and 0 <= size <= LIBFUSE_LARGEST


def test_pipe_can_hold_asks_the_kernel() -> None:
    assert pipe_can_hold(PAGE)
    assert pipe_can_hold(64 << 10)  # a pipe's default size
    assert not pipe_can_hold(1 << 31)  # more than fcntl takes
