"""What a consumer knows of its bucket, shared by the stores it follows: the bucket, the
cache's `remote.db` (state.py: every pack index read, so a chunk row can be pointed at a
pack by its hash) and the lock that serializes its use by the fetching thread and readers.
"""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..store.log.log import Location, location
from .bucket_look import indexed_packs, read_index
from .config import REMOTE_STATE_FILE, RemoteConfig
from .s3 import Bucket
from .state import RemoteState

INDEX_THREADS = 8


class ConsumerBucket:
    def __init__(self, cache: Path, cfg: RemoteConfig) -> None:
        self.bucket = Bucket(cfg)
        self.bucket.check()
        cache.mkdir(parents=True, exist_ok=True)
        self.state_path = cache / REMOTE_STATE_FILE
        self.state = RemoteState(self.state_path, cfg.url)
        self.reset = self.state.reset  # the cache served another bucket: its catalogs name packs by old numbers
        self.lock = threading.Lock()  # remote.db is used by the fetching thread and by readers

    def store_uuids(self) -> list[str]:
        """The stores that uploaded anything under the prefix (`stores/UUID/`), sorted."""
        return self.bucket.subfolders(self.bucket.key("stores", ""))

    def learn_indexes(self) -> int:
        """Read the indexes of packs not known yet, and forget packs whose index is gone (a
        remote gc deleted them; a consumer never writes to the bucket)."""
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
