"""A consumer of every store under a prefix (`cowfs mount s3://... --all-stores`): one
ReplicaSource per store (its catalog file in the cache, brought forward by its deltas) and
the merged catalog over them (merge.py), which the consumer's Replica serves. Stores that
appear under the prefix later are followed from then on; a store whose objects are all
gone leaves the merged tree (docs/design.md section 17, "One namespace for a job").

`CACHE/` holds, beside what source.py lists, `union.db`: the merged catalog, made afresh at
each mount (its inode numbers are the mount's own).
"""
from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from ..errors import CowfsError, RemoteError
from ..store.log.log import Location
from .catalogs import retained_catalogs
from .changes import Changes
from .config import RemoteConfig
from .consumer_bucket import ConsumerBucket
from .merge import MergedCatalog, Step, fresh
from .notices import Inline
from .pins import Pins
from .source import Fetched, ReplicaSource

log = logging.getLogger("cowfs.replica")
UNION_FILE = "union.db"
FETCH_THREADS = 8  # stores' catalog objects fetched side by side in one batch of steps


def _indexes_learnt(learning: "Future[None]") -> None:
    """Return once the indexes a batch of steps needs are learnt (on another thread), or
    raise why they are not."""
    try:
        learning.result()
    except Exception as e:
        raise RemoteError(f"the pack indexes were not read: {e}") from e


class UnionSource:
    """`exclude`: a store left out (a producer's own, whose peers it shows beside its own
    tree: fs/union_ops.py); such a source takes no pins."""

    def __init__(self, cache: Path, cfg: RemoteConfig, exclude: str | None = None) -> None:
        self.cache = cache
        self.cfg = cfg
        self.exclude = exclude
        self.shared = ConsumerBucket(cache, cfg)
        self.bucket = self.shared.bucket
        self.followers: dict[str, ReplicaSource] = {}
        self.merged: MergedCatalog = fresh(cache / UNION_FILE, self.shared.state_path)
        self._resync = False  # a step failed after its store's file moved on: look at everything again
        self._held: dict[str, int] = {}  # store -> the generation the merged tree shows
        self.step_seconds: dict[str, float] = {}  # the last batch of steps: its parts' times, for the log
        self.write_lock = threading.Lock()  # the merged catalog's writes: steps, and pins (pins.py)
        self.pins: Pins | None = None if exclude else Pins(cache, self.shared, self.merged, self.write_lock)
        if self.shared.reset:
            for f in cache.glob("catalog-*.db*"):
                f.unlink(missing_ok=True)
        for f in cache.glob("pin-*.db*"):  # a pin fetched or being built when a daemon was killed
            f.unlink(missing_ok=True)

    @property
    def path(self) -> Path:
        return self.merged.path

    # -- stores -------------------------------------------------------------------------

    def listed_stores(self) -> list[str]:
        """The stores under the prefix that have a catalog object (a store that published
        only where it listens for consumers has nothing to show yet)."""
        return [u for u in self.shared.store_uuids()
                if u != self.exclude and (u in self.followers or retained_catalogs(self.bucket, u))]

    def add_store(self, store: str) -> ReplicaSource:
        follower = self.followers.get(store)
        if follower is None:
            follower = self.followers[store] = ReplicaSource(self.cache, self.cfg, store, shared=self.shared)
        return follower

    def held(self, store: str) -> int:
        """The generation of `store` the merged tree shows (0: none yet)."""
        return self._held.get(store, 0)

    def newest(self, store: str) -> tuple[int, str] | None:
        """(generation, key) of the store's newest catalog object; None if it has none now."""
        try:
            return self.add_store(store).newest()
        except RemoteError:
            return None

    # -- steps ----------------------------------------------------------------------------

    def step(self, store: str, gen: int, key: str) -> Changes | None:
        """Bring `store` to generation `gen` (catalog object `key`) and merge what changed;
        returns what changed in the merged tree, None when it held `gen` already."""
        changes, failed = self.steps({store: (gen, key)})
        if failed:
            raise failed[store]
        return changes

    def steps(self, wanted: dict[str, tuple[int, str]], inline: dict[str, Inline] | None = None
              ) -> tuple[Changes | None, dict[str, Exception]]:
        """Several stores brought to the generations `wanted` names (store -> (generation,
        key)) at once: the pack indexes read once, the catalog objects fetched side by side,
        one merged transaction. Returns what changed in the merged tree (None if nothing was
        merged) and the stores that failed, with why (they keep their generation).
        `inline`: what the notices of those generations carried (store -> notices.Inline):
        when every store of the batch has it, the batch makes no request to the bucket unless
        an object names a chunk in a pack none of the notices' indexes tells of
        (consumer_bucket.py)."""
        todo = {s: gk for s, gk in wanted.items() if gk[0] > self.held(s) or self._resync}
        if not todo:
            return None, {}
        t0 = time.monotonic()
        failed: dict[str, Exception] = {}
        fetched: dict[str, Fetched] = {}
        self.step_seconds = {}
        carried = {s: inline[s] for s in todo if inline and s in inline}
        if len(carried) == len(todo) and not self._resync:
            return self._steps_carried(todo, carried, t0)
        for store in sorted(carried):  # (not read again by the learning)
            self.shared.add_indexes(carried[store].indexes)

        def learn() -> None:
            self.shared.learn_indexes()
            self.step_seconds["indexes"] = time.monotonic() - t0

        # the indexes learnt beside the downloads of the catalog objects, which wait for them
        # only to be applied (their chunk rows are pointed at the packs)
        with ThreadPoolExecutor(1 + min(len(todo), FETCH_THREADS), thread_name_prefix="cowfs-union-fetch") as pool:
            learning = pool.submit(learn)

            def fetch(store: str) -> None:
                gen, key = todo[store]
                try:
                    fetched[store] = self.add_store(store).fetch_catalog(
                        gen, key, learn=False, before_apply=lambda: _indexes_learnt(learning),
                        inline=carried.get(store))
                except CowfsError as e:
                    failed[store] = e

            list(pool.map(fetch, sorted(todo)))
            learning.result()  # a failure to learn fails the batch (its stores were not applied)
        return self._merge(fetched, failed, t0)

    def _steps_carried(self, todo: dict[str, tuple[int, str]], carried: dict[str, Inline],
                       t0: float) -> tuple[Changes | None, dict[str, Exception]]:
        """`steps` where every notice carried its objects: every notice's indexes learnt first
        (a store's delta may name chunks in a pack another store of the batch put), then the
        objects applied side by side, each after a look at the bucket only if it needs one."""
        failed: dict[str, Exception] = {}
        fetched: dict[str, Fetched] = {}
        for store in sorted(carried):
            self.shared.add_indexes(carried[store].indexes)
        self.step_seconds["notices' indexes"] = time.monotonic() - t0

        def fetch(store: str) -> None:
            gen, key = todo[store]
            try:
                fetched[store] = self.add_store(store).fetch_catalog(gen, key, inline=carried[store])
            except CowfsError as e:
                failed[store] = e

        with ThreadPoolExecutor(min(len(todo), FETCH_THREADS), thread_name_prefix="cowfs-union-fetch") as pool:
            list(pool.map(fetch, sorted(todo)))
        return self._merge(fetched, failed, t0)

    def _merge(self, fetched: dict[str, Fetched], failed: dict[str, Exception],
               t0: float) -> tuple[Changes | None, dict[str, Exception]]:
        """The fetched stores' generations merged in one transaction (`steps`)."""
        t2 = time.monotonic()
        if not fetched:
            return None, failed
        try:
            with self.write_lock:
                if self._resync:
                    for store, f in fetched.items():
                        self.merged.sources[store] = f.path
                    changes = self.merged.resync()
                    self._resync = False
                else:
                    changes = self.merged.steps([
                        Step(store, f.path, self.held(store), f.generation,
                             None if store not in self.merged.sources or f.new_file else f.changes)
                        for store, f in sorted(fetched.items())])
                self._held = self.merged.store_generations()
        except BaseException:
            self._resync = True
            raise
        self.step_seconds.update(catalogs=t2 - t0, merge=time.monotonic() - t2)
        for store, f in fetched.items():
            self.followers[store].drop_catalogs({f.path})  # the merged catalog holds what it needs of them
        return changes, failed

    def catch_up(self) -> int:
        """Every pin under the prefix made a snapshot (pins.py), then every store brought to its
        newest catalog object (at mount, so the tree shows at once what the bucket holds);
        returns how many stores there are."""
        self.shared.learn_indexes()
        pinned = self.pins.load() if self.pins is not None else 0
        if pinned:
            log.info("%d pinned snapshots shown", pinned)
        listed = self.listed_stores()
        wanted = {s: n for s in listed if (n := self.newest(s)) is not None}
        _changes, failed = self.steps(wanted)
        for store, e in failed.items():
            log.warning("store %s not shown yet: %s", store, e)
        return len(listed)

    def forget(self, store: str) -> Changes:
        follower = self.followers.pop(store, None)
        with self.write_lock:
            changes = self.merged.forget(store)
        self._held.pop(store, None)
        if follower is not None:
            follower.drop_catalogs(set())
        return changes

    # -- what the replica reads through --------------------------------------------------

    def pack(self, rowid: int) -> tuple[str, int] | None:
        return self.shared.pack(rowid)

    def locate(self, chunk_id: bytes) -> Location | None:
        return self.shared.locate(chunk_id)

    def close(self) -> None:
        self.merged.close()
        self.shared.close()
