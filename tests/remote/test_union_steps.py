"""A consumer of every store (remote/union_source.py) taking a batch of steps against the real
RGW: the catalog objects are downloaded while the pack indexes are learnt, and applied only
once they are; a failure to learn them applies nothing, and the next batch does it all."""
from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from cowfs.errors import RemoteError
from cowfs.remote import source as source_mod
from cowfs.remote.union_source import UnionSource
from tests.support.remoteutil import one_store, put_file
from tests.support.storeutil import assert_clean, data

pytestmark = pytest.mark.usefixtures("aws_env")  # the engine's keys in AWS_* (conftest.py)


def live_names(path: Path) -> set[bytes]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        (gen,) = conn.execute("SELECT value FROM meta WHERE key='generation'").fetchone()
        return {bytes(n) for (n,) in conn.execute("SELECT name FROM dentries WHERE birth_gen <= ? AND death_gen > ?",
                                                  (int(gen), int(gen)))}
    finally:
        conn.close()


def test_a_batch_downloads_its_catalogs_while_the_indexes_are_learnt(tmp_path, rgw, s3_bucket, monkeypatch):
    s1, cfg = one_store(tmp_path, rgw, s3_bucket, "s1")
    s2, _ = one_store(tmp_path, rgw, s3_bucket, "s2")
    with s1, s2:
        put_file(s1, "a.bin", data(300_000, 1))
        put_file(s2, "b.bin", data(300_000, 2))
        src = UnionSource(tmp_path / "cache", cfg)
        try:
            assert src.catch_up() == 2
            put_file(s1, "c.bin", data(300_000, 3))
            put_file(s2, "d.bin", data(300_000, 4))
            wanted = {s.config.store_uuid: src.newest(s.config.store_uuid) for s in (s1, s2)}
            downloaded = threading.Semaphore(0)
            real_get, real_learn = source_mod.ReplicaSource._get, src.shared.learn_indexes

            def counted_get(self, key, dest):  # type: ignore[no-untyped-def]
                real_get(self, key, dest)
                downloaded.release()

            def learn_once_both_are_down() -> int:  # on the old code the downloads waited for this
                for _ in range(2):
                    assert downloaded.acquire(timeout=60), "the catalog objects were not downloaded meanwhile"
                return real_learn()

            monkeypatch.setattr(source_mod.ReplicaSource, "_get", counted_get)
            monkeypatch.setattr(src.shared, "learn_indexes", learn_once_both_are_down)
            changes, failed = src.steps(wanted)  # type: ignore[arg-type]
            assert not failed and changes is not None
            assert {b"a.bin", b"b.bin", b"c.bin", b"d.bin"} <= live_names(src.path)
            assert set(src.step_seconds) == {"indexes", "catalogs", "merge"}
        finally:
            src.close()
    for s in (s1, s2):
        assert_clean(s.root)


def test_a_batch_whose_indexes_cannot_be_learnt_applies_nothing(tmp_path, rgw, s3_bucket, monkeypatch):
    s1, cfg = one_store(tmp_path, rgw, s3_bucket, "s1")
    with s1:
        put_file(s1, "a.bin", data(300_000, 5))
        src = UnionSource(tmp_path / "cache", cfg)
        try:
            assert src.catch_up() == 1
            uuid = s1.config.store_uuid
            held = src.held(uuid)
            put_file(s1, "b.bin", data(300_000, 6))
            wanted = {uuid: src.newest(uuid)}
            real_learn = src.shared.learn_indexes

            def unreachable() -> int:
                raise RemoteError("the gateway did not answer (test)")

            monkeypatch.setattr(src.shared, "learn_indexes", unreachable)
            with pytest.raises(RemoteError, match="did not answer"):
                src.steps(wanted)  # type: ignore[arg-type]
            assert src.held(uuid) == held and b"b.bin" not in live_names(src.path)
            follower = src.followers[uuid]
            current = follower.current()
            assert current is not None and current[1] == held  # its catalog file was not moved on either
            monkeypatch.setattr(src.shared, "learn_indexes", real_learn)
            changes, failed = src.steps(wanted)  # type: ignore[arg-type]
            assert not failed and changes is not None and src.held(uuid) > held
            assert {b"a.bin", b"b.bin"} <= live_names(src.path)
        finally:
            src.close()
    assert_clean(s1.root)
