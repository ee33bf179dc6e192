"""What open readers and write sessions still use, so gc keeps it.

Two kinds of hold:

* a body (content_id) an open reader or session reads: gc keeps the body, its extents and
  their chunks even when no version refers to it any more;
* records the compactor retired: a chunk re-encoded in place (compact.py) has a new record,
  and the catalog forgets the old one, but a reader opened before that still holds the old
  Location in its extents. Every hold is taken in an epoch; retiring records ends the epoch,
  and gc keeps a retired record while a hold taken in its epoch or earlier is open.

Neither is persistent: after a restart nothing is open, and records the catalog does not
name are garbage (gc reclaims them).
"""
from __future__ import annotations

import threading
from collections import Counter
from typing import Callable

RetiredRecord = tuple[int, int, int]  # (segment id, offset, stored length)


class Holds:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._contents: Counter[int] = Counter()  # content_id -> open readers and sessions
        self._epochs: Counter[int] = Counter()  # epoch -> holds taken in it and still open
        self._epoch = 0
        self._retired: list[tuple[int, RetiredRecord]] = []  # (epoch it was retired in, record)

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
