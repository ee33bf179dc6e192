"""A store's remote tier as one object: its config, its bucket, and one pass at a time.

`tier_of(store)` gives the same `RemoteTier` to the CLI's requests and to the daemon's
background uploader, so an upload asked for by hand and one started by a commit never run
together.
"""
from __future__ import annotations

import dataclasses
import os
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Callable

from ..errors import RemoteError
from ..store.upkeep.evict import evicted_count, restore_all
from ..store.upkeep.stats import physical_bytes
from . import deltas
from .bucket_fsck import check as check_bucket
from .bucket_look import Looks
from .config import (
    REMOTE_STATE_FILE,
    RemoteConfig,
    check_config,
    read_remote_config,
    remove_remote_config,
    write_remote_config,
)
from .evict import evict
from .gc import DEFAULT_GRACE, collect
from .notices import Inline
from .s3 import Bucket
from .state import RemoteState
from .upload import PushReport, push

if TYPE_CHECKING:
    from ..store import Store

_tiers: "weakref.WeakKeyDictionary[Store, RemoteTier]" = weakref.WeakKeyDictionary()
_tiers_lock = threading.Lock()


UPLOAD_NICE = 10


def _lower_priority() -> None:
    try:  # Linux: a thread's own nice value (setpriority on its thread id)
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), UPLOAD_NICE)
    except OSError:
        pass


class RemoteTier:
    def __init__(self, store: "Store") -> None:
        self.store = store
        self._lock = threading.Lock()  # one pass (or config change) at a time
        self._bucket: Bucket | None = None
        self._config: RemoteConfig | None = read_remote_config(store.root)
        self.last: PushReport | None = None
        self.last_error: str | None = None
        self._uploader: ThreadPoolExecutor | None = None
        self.looks = Looks()  # when this tier's passes last looked at the bucket (a new tier looks at everything)

    @property
    def config(self) -> RemoteConfig | None:
        return self._config

    def bucket(self) -> Bucket:
        if self._config is None:
            raise RemoteError(f"{self.store.root}: no remote set (cowfs remote set STORE s3://BUCKET/PREFIX)")
        if self._bucket is None:
            self._bucket = Bucket(self._config)
        return self._bucket

    def set(self, cfg: RemoteConfig, create_bucket: bool = False) -> bool:
        """Check `cfg`, and that the bucket answers, then keep it; returns whether the bucket was made."""
        check_config(cfg, self.store.root)
        if self._config is not None and cfg.url != self._config.url:
            self._refuse_if_evicted(f"move the remote to {cfg.url}")
        bucket = Bucket(cfg)
        made = bucket.create_bucket() if create_bucket else False
        if not made:
            bucket.check()
        with self._lock:
            write_remote_config(self.store.root, cfg)
            self._config, self._bucket, self.looks = cfg, bucket, Looks()
        return made

    def _refuse_if_evicted(self, what: str) -> None:
        n = evicted_count(self.store)
        if n:
            raise RemoteError(f"cannot {what}: {n} segments of this store are kept only in "
                              f"{self._config.url if self._config else 'its bucket'} (cowfs remote fetch brings them back first)")

    def unset(self) -> bool:
        self._refuse_if_evicted("unset the remote")
        with self._lock:
            self._config, self._bucket = None, None
            removed = remove_remote_config(self.store.root)
            deltas.uninstall(self.store)  # no change log (nor its triggers' cost) without a remote
            return removed

    def push(self, progress: Callable[[int, int], None] | None = None,
             stop: Callable[[], bool] | None = None, background: bool = False, whole: bool = False,
             on_catalog: Callable[[int, str, Inline], None] | None = None) -> PushReport:
        """One upload pass. `background` (the daemon's passes): on a thread of its own at a
        lower CPU priority (nice +UPLOAD_NICE, inherited by boto3's part threads), so saves
        going on meanwhile get the CPU first. `whole`: a whole catalog too; `on_catalog`:
        called when consumers can be told (upload.push)."""
        if background:
            if self._uploader is None:
                self._uploader = ThreadPoolExecutor(1, thread_name_prefix="cowfs-upload", initializer=_lower_priority)
            return self._uploader.submit(self.push, progress, stop, False, whole, on_catalog).result()
        with self._lock:
            bucket = self.bucket()
            state = RemoteState(self.store.root / REMOTE_STATE_FILE, bucket.cfg.url)
            try:
                report = push(self.store, bucket, state, progress=progress, stop=stop, whole=whole, on_catalog=on_catalog,
                              looks=self.looks)
                limit = self._config.local_limit if self._config is not None else None
                if limit is not None and not (stop is not None and stop()):
                    report.evicted = evict(self.store, state, limit).to_json()
                self.last, self.last_error = report, None
                return report
            except RemoteError as e:
                self.last_error = str(e)
                raise
            finally:
                state.close()

    def fetch_back(self, progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
        """Stop evicting (the limit is removed from remote.json first) and fetch every evicted
        segment back into a local file."""
        with self._lock:
            if self._config is not None and self._config.local_limit is not None:
                cfg = dataclasses.replace(self._config, local_limit=None)
                write_remote_config(self.store.root, cfg)
                self._config = cfg
            segments, nbytes = restore_all(self.store, progress)
        return {"segments": segments, "bytes": nbytes, "local_bytes": physical_bytes(self.store.root)}

    def gc(self, grace: float = DEFAULT_GRACE, progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
        """An upload pass, then the remote gc's sweep and mark (remote/gc.py)."""
        with self._lock:
            bucket = self.bucket()
            bucket.check()  # before anything local is made: an endpoint that does not answer changes nothing
            state = RemoteState(self.store.root / REMOTE_STATE_FILE, bucket.cfg.url)
            try:
                return collect(self.store, bucket, state, grace, progress).to_json()
            finally:
                state.close()

    def fsck(self, deep: bool = False, progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
        """Check that the bucket holds what the store's catalog objects need (remote/bucket_fsck.py).
        Reads only: it runs beside a pass."""
        bucket = self.bucket()
        bucket.check()
        return check_bucket(bucket, self.store.config.store_uuid, self.store.root / "tmp", deep, progress).to_json()

    def status(self) -> dict[str, Any]:
        if self._config is None:
            return {"remote": None}
        state = RemoteState(self.store.root / REMOTE_STATE_FILE, self._config.url)  # WAL: reads beside a pass
        try:
            totals = state.totals()
        finally:
            state.close()
        return {"remote": self._config.url, "endpoint": self._config.endpoint, **totals,
                "generation": self.store.generation, "local_limit": self._config.local_limit,
                "local_bytes": physical_bytes(self.store.root), "evicted_segments": evicted_count(self.store),
                "last_push": None if self.last is None else self.last.to_json(), "last_error": self.last_error}


def tier_of(store: "Store") -> RemoteTier:
    with _tiers_lock:
        tier = _tiers.get(store)
        if tier is None:
            tier = _tiers[store] = RemoteTier(store)
        return tier
