"""FUSE inode numbers for the live tree, `.snapshots/` and each snapshot's read-only view.

A store inode appears once in the live tree and once in every snapshot, each
time with possibly different contents, so each view gets its own range of
FUSE inode numbers: fuse_ino = view << VIEW_SHIFT | store_ino. View 0 is the
live tree; snapshot views are numbered as they are first looked up (a producer's mount of
the job's namespace reserves one more for the other nodes' files first: `reserve`).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

VIEW_SHIFT = 40
STORE_INO_MASK = (1 << VIEW_SHIFT) - 1
SNAPDIR_NAME = b".snapshots"
SNAPDIR_INO = STORE_INO_MASK  # the virtual .snapshots directory (view 0)


@dataclass(frozen=True)
class View:
    view_id: int
    name: str | None  # None for the live tree
    gen: int | None  # None for the live tree

    @property
    def live(self) -> bool:
        return self.view_id == 0


LIVE_VIEW = View(0, None, None)


class ViewTable:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_id: dict[int, View] = {0: LIVE_VIEW}
        self._by_name: dict[tuple[str, int], View] = {}

    def for_snapshot(self, name: str, gen: int) -> View:
        with self._lock:
            view = self._by_name.get((name, gen))
            if view is None:
                view = View(len(self._by_id), name, gen)
                self._by_id[view.view_id] = view
                self._by_name[(name, gen)] = view
            return view

    def reserve(self, name: str) -> View:
        """A view of another store's live tree (gen None, served by that store: the other
        nodes' files in a producer's mount of the job's namespace, fs/union_ops.py)."""
        with self._lock:
            view = View(len(self._by_id), name, None)
            self._by_id[view.view_id] = view
            return view

    def decode(self, fuse_ino: int) -> tuple[View, int]:
        view = self._by_id.get(fuse_ino >> VIEW_SHIFT)
        if view is None:
            raise KeyError(fuse_ino)
        return view, fuse_ino & STORE_INO_MASK

    @staticmethod
    def encode(view: View, store_ino: int) -> int:
        return view.view_id << VIEW_SHIFT | store_ino

    @staticmethod
    def is_live(fuse_ino: int) -> bool:
        """A file or directory of the live tree (its FUSE number is its store number), not `.snapshots`."""
        return fuse_ino >> VIEW_SHIFT == 0 and fuse_ino != SNAPDIR_INO
