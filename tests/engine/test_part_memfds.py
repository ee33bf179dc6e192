"""The memfds a process keeps for its next puts (cowfs/plugins/part_memfds.py): lent and given
back by part size, within a bound, closed when the daemon may still read them, none in a
child made by fork."""
from __future__ import annotations

import os

import pytest

from cowfs.plugins import part_memfds as module
from cowfs.plugins.part_memfds import PartMemfds

MIB = 1 << 20


def _open(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


def test_memfds_are_lent_again_by_part_size_within_the_bound() -> None:
    pool = PartMemfds(keep=9 * MIB)
    a, kept_a = pool.take(4 * MIB)
    b, kept_b = pool.take(4 * MIB)
    c, kept_c = pool.take(4 * MIB)  # 12 MiB would pass the bound: a one-shot memfd
    assert (kept_a, kept_b, kept_c) == (True, True, False) and pool.owned == 8 * MIB
    os.close(c)
    pool.give(a)
    assert pool.take(4 * MIB) == (a, True)  # the same memfd, its pages kept
    pool.give(a)
    a_inode = os.fstat(a).st_ino
    d, kept_d = pool.take(2 * MIB)  # another size: the free one of 4 MiB goes to make room
    assert kept_d and pool.owned == 6 * MIB and pool.free == 0
    assert (d != a or os.fstat(d).st_ino != a_inode) and (d == a or not _open(a))
    pool.drop(b)  # the daemon may still read it: closed, not lent again
    assert not _open(b) and pool.owned == 2 * MIB and pool.free == 0
    pool.give(d)
    pool.set_keep(0)  # nothing kept from now on
    one_shot, kept = pool.take(MIB)
    os.close(one_shot)
    assert not _open(d) and pool.owned == 0 and kept is False


def test_a_memfd_lent_while_the_bound_is_lowered_is_closed_when_it_comes_back() -> None:
    pool = PartMemfds(keep=8 * MIB)
    fd, kept = pool.take(4 * MIB)
    assert kept
    pool.set_keep(MIB)
    pool.give(fd)
    assert not _open(fd) and pool.owned == 0 and pool.free == 0
    with pytest.raises(ValueError, match="number of bytes"):
        pool.set_keep(-1)


def test_a_child_made_by_fork_keeps_none_of_its_parents_memfds(monkeypatch: pytest.MonkeyPatch) -> None:
    pool = PartMemfds(keep=8 * MIB)
    monkeypatch.setattr(module, "_memfds", pool)
    fd, _ = pool.take(MIB)
    pool.give(fd)
    lent, _ = pool.take(2 * MIB)  # lent when the fork comes (a put in flight)
    pid = os.fork()
    if pid == 0:
        ok = False
        try:
            fresh = module.part_memfds() is pool and pool.free == 0 and pool.owned == 0 and not _open(fd)
            pool.give(lent)  # the child's copy of the parent's put ends: closed, not kept
            ok = fresh and pool.free == 0 and pool.owned == 0 and not _open(lent)
        finally:
            os._exit(0 if ok else 1)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    assert pool.free == 1 and _open(fd) and _open(lent)  # the parent's untouched
    pool.give(lent)
    assert pool.free == 2 and pool.owned == 3 * MIB


def test_a_get_takes_the_smallest_memfd_that_holds_its_bytes_and_counts_what_it_grew_to() -> None:
    pool = PartMemfds(keep=64 * MIB)
    small, large = pool.take_for(2 * MIB), pool.take_for(8 * MIB)
    assert small is not None and large is not None
    for fd, size in ((small, 2 * MIB), (large, 8 * MIB)):
        os.ftruncate(fd, size)
        pool.give(fd)
    assert pool.take_for(MIB) == small  # the smallest that holds 1 MiB
    assert pool.take_for(3 * MIB) == large
    os.ftruncate(large, 20 * MIB)  # the daemon grew it for a larger file
    pool.give(large)
    pool.give(small)
    assert pool.owned == 22 * MIB and pool.free == 2
    assert pool.take_for(50 * MIB) is not None  # room made: the oldest free one (20 MiB) closed, no more
    assert pool.owned == 52 * MIB and pool.free == 1
    assert pool.take_for(20 * MIB) is None  # past the bound: none (the daemon makes the memfd)


def test_keep_save_memory_sets_the_process_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    import cowfs

    pool = PartMemfds(keep=8 * MIB)
    monkeypatch.setattr(module, "_memfds", pool)
    fd, _ = pool.take(MIB)
    pool.give(fd)
    cowfs.keep_save_memory(0)  # what is kept now goes, and nothing is kept from now on
    assert pool.free == 0 and pool.owned == 0 and not _open(fd)
    one_shot, kept = pool.take(MIB)
    os.close(one_shot)
    assert kept is False
    with pytest.raises(ValueError, match="number of bytes"):
        cowfs.keep_save_memory(-1)
