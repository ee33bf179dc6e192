"""The memfds a process's puts write their parts into, kept for the next put, and those its
gets of files it copies out are filled in (issue 34).

A new memfd's pages are made as the bytes are written into it: shmem allocates, zeroes and
charges every 4 KiB page, and that took a third or more of a torch.save into a fresh memfd
(256 MiB on the 2-core VM: 0.23 s into new memfds, 0.15 s into memfds whose pages were
made by an earlier save, 0.17 s into ext4's page cache; docs/benchmarks.md). So a part
that the daemon has answered for comes back here, its pages kept, and the next put's
bytes overwrite them: a training loop that saves every N steps pays for the pages once.

A kept memfd is never sealed (a seal cannot be taken off), so the daemon copies its bytes
before it hashes them (fs/put_op.py), and the memfd is written again only after the
daemon's reply to the put that sent it: a put that ends without a reply (the client
aborted, or the daemon went away) closes its memfds instead, since the daemon may still be
reading them. Past the bound (`keep`, by default a quarter of the memory: the background
saves' own bound), parts are one-shot memfds, sealed, which the daemon maps without a copy.

A get (get.py, `kept=True`) takes the smallest free memfd that holds the file, seals it
against shrinking (the daemon maps what it fills), and gives it back when its file object
is closed; the daemon then does not make its pages either (a cold DCP load of 256 MiB:
0.25 daemon CPU s instead of 0.39).

Bytes are counted by memfd: what it was lent for (a part's size, a file's size), or what it
holds if more. A child made by fork starts with none (it must not write into its parent's).
"""
from __future__ import annotations

import os
import threading
from typing import Callable

DEFAULT_KEEP_SHARE = 4  # kept memfds hold at most 1/4 of the memory by default


def new_memfd() -> int:
    return os.memfd_create("cowfs-put", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)


def memory_total() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


class PartMemfds:
    """Memfds lent by `take` (a put's parts: one of exactly that size) or `take_for` (a get:
    one that holds at least that many bytes), given back by `give` (written again later) or
    `drop` (closed). Thread-safe."""

    def __init__(self, keep: int | None = None) -> None:
        self._lock = threading.Lock()
        self._keep = memory_total() // DEFAULT_KEEP_SHARE if keep is None else keep
        self._free: list[tuple[int, int]] = []  # (memfd, bytes it counts for), oldest first
        self._lent: dict[int, int] = {}  # memfd -> bytes it counts for
        self._owned = 0  # bytes of the kept memfds, free or lent

    @property
    def owned(self) -> int:
        with self._lock:
            return self._owned

    @property
    def free(self) -> int:
        with self._lock:
            return len(self._free)

    def take(self, part_bytes: int) -> tuple[int, bool]:
        """A memfd for a part of at most `part_bytes`, and whether it is a kept one (to give
        back once the daemon answered; written at offsets from 0, its old bytes past the
        part's end left as they are) or a one-shot one (to seal, send and close)."""
        return self._take(part_bytes, lambda size: size == part_bytes)

    def take_for(self, size: int) -> int | None:
        """A kept memfd to receive `size` bytes (the smallest free one that holds them, else a
        new one); None past the bound (the daemon then makes the memfd itself)."""
        fd, kept = self._take(size, lambda capacity: capacity >= size, best_fit=True, one_shot=False)
        return fd if kept else None

    def _take(self, size: int, fits: Callable[[int], bool], best_fit: bool = False,
              one_shot: bool = True) -> tuple[int, bool]:
        """(fd, True): a kept memfd lent; (fd, False): past the bound, a new one-shot memfd, or
        -1 unless `one_shot`."""
        with self._lock:
            candidates = [i for i, (_fd, capacity) in enumerate(self._free) if fits(capacity)]
            if candidates:
                i = min(candidates, key=lambda k: self._free[k][1]) if best_fit else candidates[0]
                fd, capacity = self._free.pop(i)
                self._lent[fd] = capacity
                return fd, True
            while self._free and self._owned + size > self._keep:  # room made: the oldest go first
                fd, capacity = self._free.pop(0)
                os.close(fd)
                self._owned -= capacity
            if self._owned + size > self._keep:
                return (new_memfd() if one_shot else -1), False
            fd = new_memfd()
            self._owned += size
            self._lent[fd] = size
            return fd, True

    def give(self, fd: int) -> None:
        """A kept memfd back, to be written again (only once nothing else reads it); it now
        counts for the bytes it holds if that is more than it was lent for (a get's grew)."""
        held = os.fstat(fd).st_size
        with self._lock:
            capacity = self._lent.pop(fd, None)
            if capacity is None:  # lent before a fork, in the child: not this process's to keep
                os.close(fd)
                return
            if held > capacity:
                self._owned += held - capacity
                capacity = held
            if self._owned <= self._keep:
                self._free.append((fd, capacity))
                return
            self._owned -= capacity  # (the bound was lowered, or the memfd grew, while it was lent)
        os.close(fd)

    def drop(self, fd: int) -> None:
        """A kept memfd closed instead (the daemon may still read it)."""
        with self._lock:
            self._owned -= self._lent.pop(fd, 0)
        os.close(fd)

    def set_keep(self, keep: int) -> None:
        """Keep at most `keep` bytes from now on; free memfds above it are closed now, lent
        ones when they come back."""
        if keep < 0:
            raise ValueError(f"keep is a number of bytes, not {keep}")
        with self._lock:
            self._keep = keep
            closing = []
            while self._free and self._owned > keep:
                fd, size = self._free.pop(0)
                closing.append(fd)
                self._owned -= size
        for fd in closing:
            os.close(fd)

    def _forget_after_fork(self) -> None:
        """(the child of a fork) Its copies of the parent's memfds closed, none kept: the
        parent writes them again."""
        self._lock = threading.Lock()
        for fd, _size in self._free:
            try:
                os.close(fd)
            except OSError:
                pass
        self._free, self._lent, self._owned = [], {}, 0


_memfds: PartMemfds | None = None
_memfds_lock = threading.Lock()


def part_memfds() -> PartMemfds:
    """The process's kept memfds (made on first use)."""
    global _memfds
    with _memfds_lock:
        if _memfds is None:
            _memfds = PartMemfds()
        return _memfds


def _after_fork_in_child() -> None:
    global _memfds_lock
    _memfds_lock = threading.Lock()
    if _memfds is not None:
        _memfds._forget_after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)


def keep_save_memory(max_bytes: int) -> None:
    """Keep at most `max_bytes` of memfds between puts and gets (0: none, every part a new
    memfd, every get one the daemon makes); what is kept above it now is given back to the
    system."""
    part_memfds().set_keep(max_bytes)
