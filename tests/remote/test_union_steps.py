"""A consumer of every store (remote/union_source.py) taking a batch of steps against the real
RGW: the catalog objects are downloaded while the pack indexes are learnt, and applied only
once they are; a failure to learn them applies nothing, and the next batch does it all. A
batch whose notices carried their objects makes no request to the bucket, unless an object
names a chunk in a pack no notice told of; a look at the bucket follows it."""
from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from cowfs.errors import RemoteError
from cowfs.remote import consumer_bucket
from cowfs.remote import source as source_mod
from cowfs.remote.notices import Inline
from cowfs.remote.packs import decode_index
from cowfs.remote.s3 import Bucket
from cowfs.remote.tier import tier_of
from cowfs.store import Store
from cowfs.remote.source import ReplicaSource
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

            def counted_get(self, key, dest, carried):  # type: ignore[no-untyped-def]
                real_get(self, key, dest, carried)
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


def put_told(s: Store, name: str, blob: bytes) -> tuple[int, str, Inline]:
    """Write /run/NAME and push; what consumers are told: (generation, key, what a notice carries)."""
    s.write_file(f"/run/{name}", blob)
    told: list[tuple[int, str, Inline]] = []
    tier_of(s).push(on_catalog=lambda g, k, inline: told.append((g, k, inline)))
    assert len(told) == 1
    return told[0]


def no_requests(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every GET or LIST from now on fails the test's consumer (and is noted)."""
    made: list[str] = []

    def refuse(self, key: str, *a, **k):  # type: ignore[no-untyped-def]
        made.append(key)
        raise RemoteError(f"a request for {key} (the test allows none)")

    monkeypatch.setattr(Bucket, "get", refuse)
    monkeypatch.setattr(Bucket, "list", refuse)
    return made


def test_a_batch_from_notices_that_carried_their_objects_asks_the_bucket_nothing(tmp_path, rgw, s3_bucket,
                                                                                 monkeypatch):
    s1, cfg = one_store(tmp_path, rgw, s3_bucket, "s1")
    s2, _ = one_store(tmp_path, rgw, s3_bucket, "s2")
    with s1, s2:
        put_file(s1, "a.bin", data(300_000, 11))
        put_file(s2, "b.bin", data(300_000, 12))
        src = UnionSource(tmp_path / "cache", cfg)
        try:
            assert src.catch_up() == 2
            # the store applied first (one at a time, in the order of their names) gets a file
            # holding the other's new one: its delta names chunks in a pack only the other's
            # notice tells of
            first, second = sorted((s1, s2), key=lambda s: s.config.store_uuid)
            told = {second.config.store_uuid: put_told(second, "c.bin", data(300_000, 13))}
            told[first.config.store_uuid] = put_told(first, "d.bin", data(300_000, 13) + data(1000, 14))
            (first_pack,) = told[first.config.store_uuid][2].indexes.values()
            assert decode_index(first_pack).entries and len(decode_index(first_pack).entries) <= 2  # the rest: the other's
            monkeypatch.setattr("cowfs.remote.union_source.FETCH_THREADS", 1)
            made = no_requests(monkeypatch)
            changes, failed = src.steps({u: (g, k) for u, (g, k, _i) in told.items()},
                                        {u: i for u, (_g, _k, i) in told.items()})
            assert not failed and changes is not None and not made
            assert {b"a.bin", b"b.bin", b"c.bin", b"d.bin"} <= live_names(src.path)
            assert set(src.step_seconds) == {"notices' indexes", "catalogs", "merge"}
            assert src.shared.stale_since is not None  # a look at the bucket is due
            monkeypatch.undo()
            monkeypatch.setattr(consumer_bucket, "STALE_SECONDS", 0.0)
            assert src.shared.learn_if_stale() and src.shared.stale_since is None
            assert not src.shared.learn_if_stale()  # nothing applied since
            for u, (g, _k, _i) in told.items():
                assert src.held(u) == g
        finally:
            src.close()
    for s in (s1, s2):
        assert_clean(s.root)


@pytest.mark.parametrize("damage", ["no indexes", "a damaged index"])
def test_an_object_naming_a_pack_no_notice_told_of_is_applied_after_a_look(tmp_path, rgw, s3_bucket, monkeypatch,
                                                                          damage):
    s1, cfg = one_store(tmp_path, rgw, s3_bucket, "s1")
    with s1:
        put_file(s1, "a.bin", data(300_000, 21))
        src = UnionSource(tmp_path / "cache", cfg)
        try:
            assert src.catch_up() == 1
            uuid = s1.config.store_uuid
            g, key, inline = put_told(s1, "b.bin", data(300_000, 22))
            indexes = {} if damage == "no indexes" else {n: v[:-1] + bytes([v[-1] ^ 1]) for n, v in inline.indexes.items()}
            looks: list[int] = []
            real_learn = src.shared.learn_indexes

            def learn() -> int:
                looks.append(1)
                return real_learn()

            monkeypatch.setattr(src.shared, "learn_indexes", learn)
            changes, failed = src.steps({uuid: (g, key)}, {uuid: Inline(inline.catalog, indexes)})
            assert not failed and changes is not None and looks == [1]
            assert {b"a.bin", b"b.bin"} <= live_names(src.path)
            conn = sqlite3.connect(f"file:{src.followers[uuid].current()[0]}?mode=ro", uri=True)  # type: ignore[index]
            try:  # every chunk row points at a pack: none left unreadable
                assert conn.execute("SELECT count(*) FROM chunks WHERE seg_id = 0").fetchone()[0] == 0
            finally:
                conn.close()
        finally:
            src.close()
    assert_clean(s1.root)


def test_a_one_store_consumer_applies_what_a_notice_carried_without_requests(tmp_path, rgw, s3_bucket, monkeypatch):
    s1, cfg = one_store(tmp_path, rgw, s3_bucket, "s1")
    with s1:
        put_file(s1, "a.bin", data(300_000, 31))
        src = ReplicaSource(tmp_path / "cache", cfg, s1.config.store_uuid)
        try:
            src.fetch_catalog(*src.newest())
            g, key, inline = put_told(s1, "b.bin", data(300_000, 32))
            made = no_requests(monkeypatch)
            fetched = src.fetch_catalog(g, key, inline=inline)
            assert not made and fetched.generation == g and not fetched.new_file
            assert {b"a.bin", b"b.bin"} <= live_names(fetched.path)
            assert src.shared.stale_since is not None  # a look at the bucket is due
        finally:
            src.close()
    assert_clean(s1.root)
