"""`Heads`: the segments that take appends, several at once.

One append at a time per head: an append takes a head that no other append holds, so
appends running at once write into different segment files. Into one file they would
wait for each other twice over, on the log's lock and in the kernel (a buffered write
holds the file's inode lock while it copies). Measured on the 2-core VM (a 1 GiB file in
8 MiB `pwrite`s, /dev/shm): one thread 4.5 GB/s, two threads into one file 4.4-4.8, two
threads into two files 8.2-8.3 (docs/benchmarks.md, "Appends into several heads").

A head is opened only when every head open already takes an append, up to `most`; so a
lone writer keeps appending into one head segment, as before. A head's segment is made by
its first append (`Log._rotate`).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from contextlib import contextmanager
from typing import Iterator

from .device import FileSegment

MOST_HEADS = 8  # heads at most: past this, appends (a copy each) no longer wait for each other


@dataclass(eq=False)
class Head:
    """One segment taking appends; `lock` held by the append writing into it."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    seg: FileSegment | None = None
    seg_id: int = 0
    end: int = 0  # where the next record goes


class Heads:
    def __init__(self, most: int = MOST_HEADS) -> None:
        if most < 1:
            raise ValueError("a log needs at least one head")
        self.most = most
        self._heads: list[Head] = [Head()]
        self._lock = threading.Lock()
        self._turn = 0

    @contextmanager
    def take(self) -> Iterator[Head]:
        """A head for one append, held until it ends: the first free one, else a new one (up
        to `most`), else the next in turn, once its append ends."""
        head = self._free() or self._new()
        if head is None:
            with self._lock:
                self._turn = (self._turn + 1) % len(self._heads)
                head = self._heads[self._turn]
            head.lock.acquire()
        try:
            yield head
        finally:
            head.lock.release()

    @contextmanager
    def take_first(self) -> Iterator[Head]:
        """The first head, once the append in it ends (where appends go when no other head
        can have a segment)."""
        head = self._heads[0]
        with head.lock:
            yield head

    def _free(self) -> Head | None:
        for head in list(self._heads):
            if head.lock.acquire(blocking=False):
                return head
        return None

    def _new(self) -> Head | None:
        with self._lock:
            if len(self._heads) >= self.most:
                return None
            head = Head()
            head.lock.acquire()
            self._heads.append(head)
            return head

    def drop(self, head: Head) -> None:
        """Forget a head whose segment could not be made (held by the caller; never the first)."""
        with self._lock:
            if head is not self._heads[0] and head.seg is None and head in self._heads:
                self._heads.remove(head)

    def first(self) -> Head:
        return self._heads[0]

    def __iter__(self) -> Iterator[Head]:
        return iter(list(self._heads))
