"""What open readers, write sessions and the kernel still use, so gc and expiry keep it.

Three kinds of hold:

* a body (content_id) an open reader or session reads: gc keeps the body, its extents and
  their chunks even when no version refers to it any more;
* records the compactor retired: a chunk re-encoded in place (compact.py) has a new record,
  and the catalog forgets the old one, but a reader opened before that still holds the old
  Location in its extents. Every hold is taken in an epoch; retiring records ends the epoch,
  and gc keeps a retired record while a hold taken in its epoch or earlier is open;
* an inode the kernel knows (a FUSE lookup count above zero): a rename or an unlink may
  remove it while a process still has it (a path looked up, not yet opened; an open
  descriptor reopened through /proc/self/fd). Opening it must give the version it had, as
  on any POSIX file system, so history expiry keeps its removed versions until the
  kernel forgets it.

None is persistent: after a restart nothing is open, and records the catalog does not
name are garbage (gc reclaims them).
"""
from __future__ import annotations

import threading
from collections import Counter
from typing import Callable, Protocol, TypeVar

RetiredRecord = tuple[int, int, int]  # (segment id, offset, stored length)


class _HasIno(Protocol):
    @property
    def ino(self) -> int: ...


_Found = TypeVar("_Found", bound=_HasIno)


class Holds:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._contents: Counter[int] = Counter()  # content_id -> open readers and sessions
        self._epochs: Counter[int] = Counter()  # epoch -> holds taken in it and still open
        self._epoch = 0
        self._retired: list[tuple[int, RetiredRecord]] = []  # (epoch it was retired in, record)
        self._known_lock = threading.Lock()
        self._inodes: Counter[int] = Counter()  # store inode -> the kernel's lookup count

    def hold(self, content_id: int | None) -> Callable[[], None]:
        """Hold a body (and every record its reader may have located); returns the release."""
        with self._lock:
            epoch = self._epoch
            self._epochs[epoch] += 1
            if content_id is not None:
                self._contents[content_id] += 1
        released = False

        def release() -> None:
            nonlocal released
            with self._lock:
                if released:
                    return
                released = True
                self._epochs[epoch] -= 1
                if self._epochs[epoch] <= 0:
                    del self._epochs[epoch]
                if content_id is not None:
                    self._contents[content_id] -= 1
                    if self._contents[content_id] <= 0:
                        del self._contents[content_id]

        return release

    def contents(self) -> set[int]:
        """Bodies held open."""
        with self._lock:
            return set(self._contents)

    def retire(self, records: list[RetiredRecord]) -> None:
        """Records the catalog no longer names (call it after the transaction that replaced
        them commits, before gc can run: under gc_lock)."""
        with self._lock:
            self._retired.extend((self._epoch, r) for r in records)
            self._epoch += 1

    def retired_in_use(self) -> list[RetiredRecord]:
        """Retired records an open hold may still read; forgets the others (gc reclaims them)."""
        with self._lock:
            oldest = min(self._epochs, default=self._epoch)
            self._retired = [(e, r) for e, r in self._retired if e >= oldest]
            return [r for _, r in self._retired]

    def looked_up(self, find: Callable[[], _Found]) -> _Found:
        """Run `find` (a read of a live inode for a LOOKUP reply) and count one more lookup of
        the inode it found, with no expiry reading `known_inodes` in between: an expiry after
        this sees the count, and one before it ran after `find`'s read could see the removal."""
        with self._known_lock:
            found = find()
            self._inodes[found.ino] += 1
            return found

    def refer_inode(self, ino: int) -> None:
        """The kernel counted one more lookup of `ino` (an entry was replied)."""
        with self._known_lock:
            self._inodes[ino] += 1

    def forget_inodes(self, forgotten: list[tuple[int, int]]) -> None:
        """The kernel dropped (ino, n) lookups of each inode (FUSE FORGET)."""
        with self._known_lock:
            for ino, n in forgotten:
                left = self._inodes[ino] - n
                if left > 0:
                    self._inodes[ino] = left
                else:
                    del self._inodes[ino]

    def known_inodes(self) -> set[int]:
        """Inodes the kernel may still send requests for."""
        with self._known_lock:
            return set(self._inodes)
