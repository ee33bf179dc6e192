"""A consumer's catalog file (remote/source.py), against the real RGW: deltas applied in
place, rows pointed again at packs that moved, a held file no delta applies to, a kill -9
inside a delta's transaction, and a catalog object deleted between its listing and its GET
(the producer's retention) after a whole catalog had already made a new file."""
from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from cowfs.remote.bucket_look import INDEX_EVERY
from cowfs.remote.s3 import MissingObject
from cowfs.remote.source import ReplicaSource
from cowfs.remote.tier import tier_of
from tests.support.remoteutil import delete_pack, one_store, pack_names, put_file, read_back
from tests.support.storeutil import assert_clean, data


pytestmark = pytest.mark.usefixtures("aws_env")  # the engine's keys in AWS_* (conftest.py)


def stray_rows(catalog: Path, source: ReplicaSource) -> int:
    """Chunk rows of a consumer's catalog file that point at a pack its remote.db does not know."""
    conn = sqlite3.connect(catalog)
    try:
        conn.execute("ATTACH DATABASE ? AS r", (str(source.cache / "remote.db"),))
        return int(conn.execute("SELECT count(*) FROM chunks WHERE seg_id != 0 AND seg_id NOT IN"
                                " (SELECT id FROM r.packs)").fetchone()[0])
    finally:
        conn.close()


def test_a_consumer_points_again_the_rows_of_a_pack_deleted_under_it(tmp_path, rgw, s3_bucket):
    """A pack deleted by hand (fsck's way back): the producer's next pass finds it gone,
    uploads its chunks again and a whole catalog beside the delta; a consumer applying the
    delta points the rows it had in that pack at the new one. Its catalog file is made as one
    from before deltas (no replica_packs_used) first. Then a held catalog the next delta does
    not apply to: the consumer starts again from the whole catalog."""
    blob = data(2 << 20, 70)
    s, cfg = one_store(tmp_path, rgw, s3_bucket)
    with s:
        (pack,) = put_file(s, "a.bin", blob)
        src = ReplicaSource(tmp_path / "cache", cfg, s.config.store_uuid)
        try:
            held = src.fetch_catalog(*src.newest()).path
            conn = sqlite3.connect(held)
            conn.execute("DROP TABLE replica_packs_used")
            conn.commit()
            conn.close()
            delete_pack(cfg, pack)
            s.write_file("/run/b.bin", data(100_000, 71))
            looks = tier_of(s).looks
            assert looks.index is not None
            looks.index -= INDEX_EVERY  # as if a second had passed: the pass's first look lists index/
            r = tier_of(s).push()
            assert r.whole_key and r.delta_key and r.bytes > len(blob) and pack not in pack_names(cfg)
            new = src.fetch_catalog(r.generation, r.delta_key).path
            assert new == held  # applied in place
            assert stray_rows(new, src) == 0
            conn = sqlite3.connect(new)
            assert conn.execute("SELECT count(*) FROM chunks WHERE seg_id = 0").fetchone()[0] == 0
            conn.execute("UPDATE meta SET value='another' WHERE key='store_uuid'")  # no delta applies to it now
            conn.commit()
            conn.close()
            s.write_file("/run/c.bin", data(100_000, 72))
            r2 = tier_of(s).push()
            assert r2.delta_key and not r2.whole_key
            last = src.fetch_catalog(r2.generation, r2.delta_key).path
            assert last != held  # a new file, from the whole catalog
            conn = sqlite3.connect(last)
            names = {bytes(n) for (n,) in conn.execute("SELECT name FROM dentries WHERE death_gen > ?", (r2.generation,))}
            uuid = conn.execute("SELECT value FROM meta WHERE key='store_uuid'").fetchone()[0]
            conn.close()
            assert {b"a.bin", b"b.bin", b"c.bin"} <= names and uuid == s.config.store_uuid
            assert stray_rows(last, src) == 0
        finally:
            src.close()
        assert read_back(cfg, s.config.store_uuid, tmp_path) == {
            "/run/a.bin": blob, "/run/b.bin": data(100_000, 71), "/run/c.bin": data(100_000, 72)}
    assert_clean(s.root)


KILLED_MID_DELTA = """
import os, signal, sys
from pathlib import Path
from cowfs.remote import source
from cowfs.remote.config import RemoteConfig

def apply_then_die(conn, from_gen):
    source_apply(conn, from_gen)
    os.kill(os.getpid(), signal.SIGKILL)  # inside the transaction, the delta's rows written

source_apply, source.apply_delta = source.apply_delta, apply_then_die
url, endpoint, cache, uuid, gen, key = sys.argv[1:]
src = source.ReplicaSource(Path(cache), RemoteConfig(url, endpoint=endpoint), uuid)
src.fetch_catalog(int(gen), key)
"""


def test_a_consumer_killed_while_applying_a_delta_holds_the_generation_before(tmp_path, rgw, s3_bucket, monkeypatch):
    """kill -9 of a consumer inside the transaction that applies a delta to its catalog file in
    place: the file still holds the generation before, whole; the delta then applies."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", rgw.credentials.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", rgw.credentials.secret_key)
    s, cfg = one_store(tmp_path, rgw, s3_bucket)
    cache = tmp_path / "cache"
    with s:
        put_file(s, "a.bin", data(300_000, 80))
        src = ReplicaSource(cache, cfg, s.config.store_uuid)
        try:
            first = src.fetch_catalog(*src.newest())
            s.write_file("/run/b.bin", data(200_000, 81))
            r = tier_of(s).push()
            assert r.delta_key
            child = subprocess.run([sys.executable, "-c", KILLED_MID_DELTA, cfg.url, str(cfg.endpoint), str(cache),
                                    s.config.store_uuid, str(r.generation), r.delta_key], capture_output=True)
            assert child.returncode == -9, child.stderr.decode()
            assert src.current() == (first.path, first.generation)
            conn = sqlite3.connect(first.path)
            assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
            conn.close()
            got = src.fetch_catalog(r.generation, r.delta_key)
            assert (got.path, got.generation, got.new_file) == (first.path, r.generation, False)
            assert {(n, p) for p, n in got.changes.entries} >= {(b"b.bin", s.resolve("/run").ino)}
            assert stray_rows(got.path, src) == 0
        finally:
            src.close()
    assert_clean(s.root)


def test_a_delta_deleted_after_its_listing_is_followed_by_the_whole_catalog_that_replaced_it(
        tmp_path, rgw, s3_bucket, monkeypatch):
    """A consumer with nothing held follows the chain whole G1, delta G1->G2, delta G2->G3; the
    last is deleted between the listing and its GET (the producer's retention, after a whole
    catalog of G3 went up). The consumer lists again and makes G3 from that whole catalog: a
    new file, with what changed since nothing; the file G1 and G2 made is left to drop."""
    s, cfg = one_store(tmp_path, rgw, s3_bucket)
    with s:
        put_file(s, "a.bin", data(300_000, 90))
        s.write_file("/run/b.bin", data(200_000, 91))
        r2 = tier_of(s).push()
        s.write_file("/run/c.bin", data(200_000, 92))
        r3 = tier_of(s).push()
        assert r2.delta_key and r3.delta_key and not r2.whole_key and not r3.whole_key
        src = ReplicaSource(tmp_path / "cache", cfg, s.config.store_uuid)
        original_get = ReplicaSource._get
        asked: list[str] = []

        def get(self: ReplicaSource, key: str, dest: Path, carried: tuple[str, bytes] | None) -> None:
            asked.append(key.rsplit("/", 1)[-1])
            if key == r3.delta_key and asked.count(asked[-1]) == 1:
                whole = tier_of(s).push(whole=True)  # the producer's next whole catalog, of G3
                assert whole.whole_key and whole.generation == r3.generation
                self.bucket.delete([key])  # and its retention deletes the delta
            original_get(self, key, dest, carried)

        monkeypatch.setattr(ReplicaSource, "_get", get)
        try:
            gen, key = src.newest()
            assert (gen, key) == (r3.generation, r3.delta_key)
            got = src.fetch_catalog(gen, key)
            assert [n.endswith(".db.zst") for n in asked] == [True, False, False, True], asked
            assert got.generation == r3.generation and got.new_file
            files = sorted(src.cache.glob("catalog-*.db"))
            assert len(files) == 2 and got.path in files  # the one from G1 (at G2) and the new one
            assert src.current() == (got.path, r3.generation)
            run = s.resolve("/run").ino
            assert {(b"a.bin", run), (b"b.bin", run), (b"c.bin", run)} <= {(n, p) for p, n in got.changes.entries}
            assert stray_rows(got.path, src) == 0
            # leftovers of fetches cut short beside the file kept: a whole catalog's .tmp, a delta's part
            leftovers = [got.path.with_name(got.path.name + ".tmp"), got.path.with_name(f"{got.path.name}.99.delta")]
            for f in leftovers:
                f.write_bytes(b"cut short")
            src.drop_catalogs({got.path})
            left = {f.name for f in src.cache.glob("catalog-*")}
            assert {n for n in left if not n.endswith(("-wal", "-shm", ".reserve"))} == {got.path.name}, left
            with pytest.raises(MissingObject):  # gone for good: a second attempt does not hide it
                original_get(src, r3.delta_key, tmp_path / "x")
        finally:
            src.close()
        assert read_back(cfg, s.config.store_uuid, tmp_path) == {
            "/run/a.bin": data(300_000, 90), "/run/b.bin": data(200_000, 91), "/run/c.bin": data(200_000, 92)}
    assert_clean(s.root)
