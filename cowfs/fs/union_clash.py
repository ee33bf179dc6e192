"""The clash rule on a node's own mount of the job's namespace (fs/union_ops.py): where the
store and another store both hold a path (not two directories, which merge), the entry whose
last change has the higher generation shows, of equal generations the larger store UUID, as
on every consumer of the prefix (remote/merge.py). The store's generations and its peers'
are one Lamport clock (fs/namespace_clock.py), so a change made here after this node saw
the other's wins, and one the other made after seeing this node's wins there and here.

`PeerWins` keeps the (few) paths at which another store's entry wins over the store's own:
looked at for the paths each of the peers' steps changed, and for every path at mount; a
change the store makes at a path takes it out of the set at once (its commit has the newest
generation this node knows: it wins until a peer's later change says otherwise at the next
step). Lookups and listings look at the set only while it is not empty.
"""
from __future__ import annotations

import os
import threading
from typing import Iterable

from ..remote.merge import entry_key, tree_paths
from ..remote.union_source import UnionSource
from ..store import Store
from ..store.catalog.events import Event
from ..store.catalog.namespace import current_gen


def _raw(path: str) -> bytes:
    """A mount path ("/a/b") as the merge code names it (b"a/b")."""
    return os.fsencode(path.strip("/"))


class PeerWins:
    def __init__(self, store: Store, source: UnionSource) -> None:
        self.store = store
        self.source = source
        self._lock = threading.Lock()
        self._paths: set[str] = set()
        self._unsubscribe = store.events.subscribe(self._own_change)

    def __bool__(self) -> bool:
        return bool(self._paths)

    def __contains__(self, path: str) -> bool:
        return path in self._paths

    def _own_change(self, event: Event) -> None:
        """(the committing thread) The store changed `event`'s paths: its entries there win now."""
        for path in (event.path, event.old_path):
            if path and self._paths:
                with self._lock:
                    self._paths = {p for p in self._paths if p != path and not p.startswith(path.rstrip("/") + "/")}

    def look(self, paths: Iterable[str]) -> set[str]:
        """(a worker thread) Apply the rule at `paths`; returns those whose winner changed."""
        wanted = sorted(set(paths))
        if not wanted:
            return set()
        raw = {p: _raw(p) for p in wanted}
        own_uuid = self.store.config.store_uuid

        def own_keys(conn):  # type: ignore[no-untyped-def]
            gen = current_gen(conn)
            return {p: entry_key(own_uuid, conn, gen, b) for p, b in raw.items()}

        own = self.store.catalog.read(own_keys)
        with self.source.write_lock:  # no step moves the peers' catalog files meanwhile
            theirs = self.source.merged.winners([raw[p] for p in wanted if own[p] is not None])
        flipped = set()
        with self._lock:
            for p in wanted:
                mine, other = own[p], theirs.get(raw[p])
                wins = mine is not None and other is not None and not (mine[1] and other[1]) and other[0] > mine[0]
                if wins != (p in self._paths):
                    flipped.add(p)
                    (self._paths.add if wins else self._paths.discard)(p)
        return flipped

    def look_everywhere(self) -> set[str]:
        """(at mount) Apply the rule at every path the peers hold."""
        with self.source.write_lock:
            merged = self.source.merged
            paths = tree_paths(merged.conn, merged.generation)
        return self.look("/" + os.fsdecode(p) for p in paths if p)

    def close(self) -> None:
        self._unsubscribe()
