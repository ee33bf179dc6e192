"""The memfds a process's puts write their parts into, kept for the next put (issue 34).

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

Bytes are counted by part: a memfd lent for parts of P bytes counts P bytes until it is
closed. A child made by fork starts with none (it must not write into its parent's).
"""
from __future__ import annotations

import os
import threading

DEFAULT_KEEP_SHARE = 4  # kept memfds hold at most 1/4 of the memory by default


def new_memfd() -> int:
    return os.memfd_create("cowfs-put", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)


def memory_total() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


class PartMemfds:
    """Memfds for parts of a given size, lent by `take` and given back by `give` (written
    again later) or `drop` (closed). Thread-safe."""

    def __init__(self, keep: int | None = None) -> None:
        self._lock = threading.Lock()
        self._keep = memory_total() // DEFAULT_KEEP_SHARE if keep is None else keep
        self._free: list[tuple[int, int]] = []  # (memfd, part bytes), oldest first
        self._owned = 0  # part bytes of the kept memfds, free or lent

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
        with self._lock:
            for i, (fd, size) in enumerate(self._free):
                if size == part_bytes:
                    del self._free[i]
                    return fd, True
            while self._free and self._owned + part_bytes > self._keep:  # room made: other sizes go first
                fd, size = self._free.pop(0)
                os.close(fd)
                self._owned -= size
            kept = self._owned + part_bytes <= self._keep
            if kept:
                self._owned += part_bytes
        return new_memfd(), kept

    def give(self, fd: int, part_bytes: int) -> None:
        """A kept memfd back, to be written again (only once nothing else reads it)."""
        with self._lock:
            if self._owned <= self._keep:
                self._free.append((fd, part_bytes))
                return
            self._owned -= part_bytes  # (the bound was lowered while it was lent)
        os.close(fd)

    def drop(self, fd: int, part_bytes: int) -> None:
        """A kept memfd closed instead (the daemon may still read it)."""
        with self._lock:
            self._owned -= part_bytes
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
        self._free, self._owned = [], 0


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
    """Keep at most `max_bytes` of memfds between saves (0: none, every part a new memfd);
    what is kept above it now is given back to the system."""
    part_memfds().set_keep(max_bytes)
