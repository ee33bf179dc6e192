"""Which states each path may be in, from the writer's records: the rules every check
judges the mount by (a close makes its version the one state, a rename is all or
nothing, a create may be seen empty, ...)."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Iterable

from .states import DIR, EMPTY, RUN, SAVE_FILE_TMP, PathState


@dataclass
class WriterRename:
    """One os.replace of the writer, from its records (times are CLOCK_MONOTONIC)."""
    src: str
    dst: str
    dst_before: set[PathState]  # states dst may have had before
    src_states: set[PathState]  # states src may have had (and dst has after)
    t_begin: float
    t_src_closed: float  # src's last close returned: it exists from then until the rename
    t_done: float = math.inf  # the `renamed` record
    t_next: float = math.inf  # the next rename onto dst begins


class AllowedStates:
    """Which states each path may be in, from the writer's records. A state is DIR, a
    sha256 of the whole file, or None (absent)."""

    def __init__(self) -> None:
        self.allowed: dict[str, set[PathState]] = {RUN: {DIR}}
        self.ever: dict[str, set[PathState]] = {RUN: {DIR}}
        self.renames: list[WriterRename] = []  # since the last settle
        self.last_closed: dict[str, float] = {}  # path -> time of its last `closed` record
        self.what: dict[str, str] = {EMPTY: "empty (freshly created)"}  # sha -> description
        self.first_t: dict[str, float] = {}  # sha -> time of its first `begin`
        # safetensors' save_file (0.8) writes a `.tmp<random>` sibling, renames it onto the
        # target and only then closes it: until its close, that sibling may exist (empty)
        self.tmp_pending: dict[str, int] = {}  # dir -> save_file writes begun, not closed
        self.tmp_dirs_ever: set[str] = set()
        self.how: dict[str, str] = {}  # path -> how its pending write is done

    def get(self, path: str) -> set[PathState]:
        return self.allowed.get(path, {None})

    def _set(self, path: str, states: Iterable[PathState]) -> None:
        self.allowed[path] = set(states)
        self.ever.setdefault(path, set()).update(self.allowed[path])

    def apply(self, r: dict) -> None:
        """Move on by one writer record."""
        ev = r["ev"]
        if ev == "begin":
            self._begin(r)
        elif ev == "closed":
            self._closed(r)
        elif ev == "rename_begin":
            self._rename_begin(r)
        elif ev == "renamed":
            self._renamed(r)
        elif ev == "unlink_begin":
            self._set(r["path"], self.get(r["path"]) | {None})
        elif ev == "unlinked":
            self._set(r["path"], {None})
        elif ev == "mkdir_begin":
            self._set(r["path"], self.get(r["path"]) | {DIR})
        elif ev == "mkdir_done":
            self._set(r["path"], {DIR})
        elif ev in ("rmtree_begin", "rmtree_done"):
            d = r["path"]
            for p in [p for p in self.allowed if p == d or p.startswith(d + "/")]:
                self._set(p, (self.get(p) | {None}) if ev == "rmtree_begin" else {None})

    def _begin(self, r: dict) -> None:
        prev = self.get(r["path"])
        new = prev | {r["sha"]}
        if None in prev:  # open(O_CREAT) makes an empty file first
            new.add(EMPTY)
        self.what.setdefault(r["sha"], f"step {r['step']} ({r['size']} bytes, {r['how']})")
        self.first_t.setdefault(r["sha"], r["t"])
        self._set(r["path"], new)
        self.how[r["path"]] = r["how"]
        if r["how"] == "save_file":
            d = os.path.dirname(r["path"])
            self.tmp_pending[d] = self.tmp_pending.get(d, 0) + 1
            self.tmp_dirs_ever.add(d)

    def _closed(self, r: dict) -> None:
        self._set(r["path"], {r["sha"]})
        self.last_closed[r["path"]] = r["t"]
        if self.how.pop(r["path"], None) == "save_file":
            d = os.path.dirname(r["path"])
            self.tmp_pending[d] -= 1
            if not self.tmp_pending[d]:
                del self.tmp_pending[d]

    def _rename_begin(self, r: dict) -> None:
        src, dst = r["src"], r["dst"]
        for rn in self.renames:
            if rn.dst == dst and rn.t_next == math.inf:
                rn.t_next = r["t"]
        self.renames.append(WriterRename(src, dst, set(self.get(dst)), set(self.get(src)), r["t"],
                                         self.last_closed.get(src, math.inf)))
        self._set(dst, self.get(dst) | self.get(src))
        self._set(src, self.get(src) | {None})

    def _renamed(self, r: dict) -> None:
        for rn in self.renames:
            if (rn.src, rn.dst, rn.t_done) == (r["src"], r["dst"], math.inf):
                self._set(rn.dst, rn.src_states)
                self._set(rn.src, {None})
                rn.t_done = r["t"]
                break

    def replay(self, records: list[dict],
               windows: dict[str, tuple[float, float]]) -> dict[str, dict[str, set[PathState]]]:
        """Apply a cycle's records in order. For each window (t1, t2), return path -> every state
        the path may have had at some moment within it (paths not listed: only absent).

        The model after the records stamped up to time t allows every state possible at t:
        `begin`-like records are stamped before the change, `closed`-like ones after it."""
        out: dict[str, dict[str, set[PathState]]] = {name: {} for name in windows}
        taken: set[str] = set()

        def take(name: str) -> None:
            seen = out[name]
            for p in set(self.allowed) | set(seen):
                seen[p] = seen.get(p, {None} if name in taken else set()) | self.get(p)
            taken.add(name)

        for k in range(len(records) + 1):
            lo = records[k - 1]["t"] if k else -math.inf  # this model state holds from lo to hi
            hi = records[k]["t"] if k < len(records) else math.inf
            for name, (t1, t2) in windows.items():
                if lo <= t2 and hi > t1:
                    take(name)
            if k < len(records):
                self.apply(records[k])
        return out

    def rename_violation(self, rn: WriterRename, src_state: PathState, dst_state: PathState) -> str | None:
        """A state of (src, dst) that is no moment of the rename: it is all or nothing."""
        if src_state is not None and dst_state not in rn.dst_before:
            return (f"rename {rn.src} -> {rn.dst} half done: {rn.src} still exists but {rn.dst} is "
                    f"{self.describe(dst_state)}")
        if src_state is None and dst_state not in rn.src_states:
            return f"rename {rn.src} -> {rn.dst}: {rn.src} is gone but {rn.dst} is {self.describe(dst_state)}"
        return None

    def may_be_save_file_tmp(self, path: str, state: PathState, ever: bool = False) -> bool:
        """An empty `.tmp<random>` left by a save_file that was under way (or ever ran: `ever`)."""
        d, name = os.path.split(path)
        return (state == EMPTY and SAVE_FILE_TMP.fullmatch(name) is not None
                and d in (self.tmp_dirs_ever if ever else self.tmp_pending))

    def settle(self, live: dict[str, PathState]) -> None:
        """After a check: what is live is now the one state of every path."""
        self.tmp_pending.clear()
        self.how.clear()
        for p in set(self.allowed) | set(live):
            if p in live:
                self._set(p, {live[p]})
            else:
                self.allowed.pop(p, None)
        self.renames.clear()

    def describe(self, state: PathState) -> str:
        if state is None:
            return "absent"
        if state == DIR:
            return "a directory"
        return f"{state[:12]} [{self.what.get(state, 'unknown content')}]"

    def describe_all(self, states: Iterable[PathState]) -> str:
        return ", ".join(sorted(self.describe(s) for s in states))


def ends_at(r: dict, path: str) -> bool:
    """Does this writer record begin a change that can end the current version at `path`
    (replace it, rename it away or over it, delete it)?"""
    ev = r["ev"]
    return ((ev in ("begin", "unlink_begin") and r["path"] == path)
            or (ev == "rename_begin" and path in (r["src"], r["dst"]))
            or (ev == "rmtree_begin" and path.startswith(r["path"] + "/")))
