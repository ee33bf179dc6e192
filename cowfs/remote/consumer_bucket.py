"""What a consumer knows of its bucket, shared by the stores it follows: the bucket, the
cache's `remote.db` (state.py: every pack index read, so a chunk row can be pointed at a
pack by its hash) and the lock that serializes its use by the fetching thread and readers.

Packs are learnt two ways: by a look at the bucket (`learn_indexes`: `index/` listed, new
indexes read, packs whose index is gone forgotten), and from the indexes a notice carried
(`add_indexes`). A catalog object is applied only once every chunk it names is in a known
pack (`unresolved`), after a look at the bucket if not. When objects were applied without a
look, one follows once the first of them is STALE_SECONDS old (`learn_if_stale`, which the
followers call every STALE_SECONDS or so), so that packs a
remote gc deleted are forgotten and the chunk rows pointing at them are pointed elsewhere
by the next object applied, as before.
"""
from __future__ import annotations

import logging
import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..errors import CorruptData
from ..store.log.log import Location, location
from .bucket_look import indexed_packs, read_index
from .config import REMOTE_STATE_FILE, RemoteConfig
from .packs import decode_index
from .s3 import Bucket
from .state import RemoteState

log = logging.getLogger("cowfs.replica")
INDEX_THREADS = 8
STALE_SECONDS = 2.0  # objects applied without a look at the bucket: one follows within this long


class ConsumerBucket:
    def __init__(self, cache: Path, cfg: RemoteConfig) -> None:
        self.bucket = Bucket(cfg)
        self.bucket.check()
        cache.mkdir(parents=True, exist_ok=True)
        self.state_path = cache / REMOTE_STATE_FILE
        self.state = RemoteState(self.state_path, cfg.url)
        self.reset = self.state.reset  # the cache served another bucket: its catalogs name packs by old numbers
        self.lock = threading.Lock()  # remote.db is used by the fetching thread and by readers
        self._learning = threading.Lock()  # one learning at a time (two would read the same indexes)
        self.stale_since: float | None = None  # when an object was first applied without a look since the last

    def store_uuids(self) -> list[str]:
        """The stores that uploaded anything under the prefix (`stores/UUID/`), sorted."""
        return self.bucket.subfolders(self.bucket.key("stores", ""))

    def learn_indexes(self) -> int:
        """Read the indexes of packs not known yet, and forget packs whose index is gone (a
        remote gc deleted them; a consumer never writes to the bucket)."""
        with self._learning:
            began = time.monotonic()
            n = self._learn()
            if self.stale_since is not None and self.stale_since <= began:
                self.stale_since = None
            return n

    def _learn(self) -> int:
        with self.lock:
            known = self.state.known_packs()
        listed = indexed_packs(self.bucket)
        with self.lock:
            self.state.forget_packs(known - listed)
        new = sorted(listed - known)
        if len(new) > 1:  # several stores' new packs at once: their indexes are read side by side
            with ThreadPoolExecutor(min(len(new), INDEX_THREADS), thread_name_prefix="cowfs-index") as pool:
                indexes = list(pool.map(lambda name: read_index(self.bucket, name), new))
        else:
            indexes = [read_index(self.bucket, name) for name in new]
        n = 0
        for name, idx in zip(new, indexes):
            if idx is None:
                continue
            with self.lock:
                self.state.add_pack(name, idx.size, idx.entries, mine=False)
            n += 1
        return n

    def add_indexes(self, indexes: dict[str, bytes]) -> int:
        """Learn the packs of index objects a notice carried, checked as those read from the
        bucket are (checksum, the pack's name); returns how many were new."""
        n = 0
        with self._learning:
            for name, data in sorted(indexes.items()):
                with self.lock:
                    if self.state.conn.execute("SELECT 1 FROM packs WHERE name=?", (name,)).fetchone():
                        continue
                try:
                    idx = decode_index(data, expect_name=name)
                except CorruptData as e:
                    log.warning("the index of pack %s a notice carried is not used: %s", name[:16], e)
                    continue
                with self.lock:
                    self.state.add_pack(name, idx.size, idx.entries, mine=False)
                n += 1
        return n

    def unresolved(self, catalog: Path) -> int:
        """How many chunk rows of a catalog file (a whole catalog or a delta) name a chunk no
        known pack holds."""
        conn = sqlite3.connect(f"file:{catalog}?mode=ro", uri=True)
        try:
            conn.execute("ATTACH DATABASE ? AS r", (f"file:{self.state_path}?mode=ro",))
            (n,) = conn.execute("SELECT count(*) FROM main.chunks c WHERE NOT EXISTS"
                                " (SELECT 1 FROM r.objects o WHERE o.hash = c.hash)").fetchone()
            return int(n)
        finally:
            conn.close()

    def applied_without_look(self) -> None:
        """Note that an object was applied from packs learnt without a look at the bucket."""
        if self.stale_since is None:
            self.stale_since = time.monotonic()

    def learn_if_stale(self) -> bool:
        """Look at the bucket if an object was applied without a look STALE_SECONDS ago or
        more; whether it looked."""
        since = self.stale_since
        if since is None or time.monotonic() - since < STALE_SECONDS:
            return False
        self.learn_indexes()
        return True

    def pack(self, rowid: int) -> tuple[str, int] | None:
        with self.lock:
            row = self.state.conn.execute("SELECT name, size FROM packs WHERE rowid=?", (rowid,)).fetchone()
        return None if row is None else (str(row[0]), int(row[1]))

    def locate(self, chunk_id: bytes) -> Location | None:
        with self.lock:
            row = self.state.conn.execute(
                "SELECT p.rowid, o.offset, o.stored_len, o.codec, o.raw_len FROM objects o JOIN packs p"
                " ON p.name = o.pack WHERE o.hash=?", (chunk_id,)).fetchone()
        return None if row is None else location(*row)

    def close(self) -> None:
        with self.lock:
            self.state.close()
