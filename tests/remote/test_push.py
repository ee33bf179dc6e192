"""Upload passes against the real RGW: what lands in the bucket, dedup across stores, passes
cut short (network errors, a kill -9), gc and compaction meanwhile, and bad settings."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cowfs.errors import InvalidArgument, RemoteError
from cowfs.remote.config import RemoteConfig
from cowfs.remote.notices import Inline
from cowfs.remote.s3 import AccessDenied, Bucket
from cowfs.remote.tier import tier_of
from cowfs.store import ROOT_INO, Store
from tests.support.remoteutil import bucket_objects, read_back
from tests.support.storeutil import assert_clean, data, new_store


def configure(store: Store, rgw, bucket: str, prefix: str = "p") -> RemoteConfig:
    cfg = RemoteConfig(f"s3://{bucket}/{prefix}", endpoint=rgw.credentials.endpoint)
    tier_of(store).set(cfg)
    return cfg


pytestmark = pytest.mark.usefixtures("aws_env")  # the engine's keys in AWS_* (conftest.py)


def test_push_uploads_chunks_and_catalog_then_only_what_is_new(tmp_path, rgw, s3_bucket, monkeypatch):
    from cowfs.remote.state import RemoteState

    queries: list[object] = []
    real_missing = RemoteState.missing_chunks

    def counted(self, copy):  # type: ignore[no-untyped-def]
        queries.append(copy)
        return real_missing(self, copy)

    monkeypatch.setattr(RemoteState, "missing_chunks", counted)
    path = new_store(tmp_path / "s")
    with Store.open(path) as s:
        s.mkdir(ROOT_INO, b"run")
        s.write_file("/run/a.bin", data(3 << 20, 1))
        s.write_file("/run/b.bin", data(1 << 20, 2) * 2)  # repeats itself: its chunks are stored once
        s.snapshot_create("one")
        cfg = configure(s, rgw, s3_bucket.name)
        first = tier_of(s).push()
        assert first.packs >= 1 and first.generation == s.generation and not first.skipped
        objs = bucket_objects(cfg)
        packs = [k for k in objs if "/packs/" in k]
        assert len(packs) == first.packs and all(k.replace("/packs/", "/index/") in objs for k in packs)
        assert sum(objs[k] for k in packs) == first.bytes
        assert tier_of(s).push().skipped  # nothing new
        assert read_back(cfg, s.config.store_uuid, tmp_path) == {"/run/a.bin": data(3 << 20, 1), "/run/b.bin": data(1 << 20, 2) * 2}
        # a new version: only its new chunks go up
        s.write_file("/run/a.bin", data(3 << 20, 1)[:2 << 20] + data(1 << 20, 3))
        queries.clear()
        second = tier_of(s).push()
        assert 0 < second.bytes < 2 << 20
        # a delta pass: what the catalog needs comes from the delta's extents, never from a
        # query over every chunk row (design.md section 17, "Catalog deltas")
        assert second.delta_key and not second.whole_key and len(queries) == 0
        assert read_back(cfg, s.config.store_uuid, tmp_path)["/run/a.bin"] == data(3 << 20, 1)[:2 << 20] + data(1 << 20, 3)
        assert tier_of(s).status()["catalog_generation"] == s.generation
    assert_clean(path)


def test_two_stores_sharing_a_prefix_store_each_chunk_once(tmp_path, rgw, s3_bucket):
    series = [data(2 << 20, k) for k in range(3)]
    pack_bytes = []
    for name in ("s1", "s2"):
        path = new_store(tmp_path / name)
        with Store.open(path) as s:
            s.mkdir(ROOT_INO, b"run")
            cfg = configure(s, rgw, s3_bucket.name, prefix="shared")
            for k, blob in enumerate(series):
                s.write_file(f"/run/ckpt-{k}.bin", blob)
                tier_of(s).push()
            pack_bytes.append(tier_of(s).status()["uploaded_bytes"])
        assert_clean(path)
    objs = bucket_objects(cfg)
    in_packs = sum(n for k, n in objs.items() if "/packs/" in k)
    assert pack_bytes[1] == 0, "the second store found every chunk already in the bucket"
    assert in_packs == pack_bytes[0] and in_packs < sum(map(len, series)) * 1.01
    cats = [k for k in objs if "/catalog/" in k]
    assert len(cats) == 2 * 3 and len([k for k in cats if k.endswith(".db.zst")]) == 2  # each: a whole, 2 deltas


def test_a_pack_whose_index_was_not_written_is_adopted(tmp_path, rgw, s3_bucket, monkeypatch):
    path = new_store(tmp_path / "s")
    with Store.open(path) as s:
        s.mkdir(ROOT_INO, b"run")
        s.write_file("/run/a.bin", data(2 << 20, 7))
        cfg = configure(s, rgw, s3_bucket.name)
        real_put = Bucket.put

        def put_but_not_indexes(self, key, payload):  # the network drops after the pack's PUT
            if "/index/" in key:
                raise RemoteError("connection dropped (test)")
            return real_put(self, key, payload)

        monkeypatch.setattr(Bucket, "put", put_but_not_indexes)
        with pytest.raises(RemoteError, match="dropped"):
            tier_of(s).push()
        monkeypatch.setattr(Bucket, "put", real_put)
        objs = bucket_objects(cfg)
        assert len([k for k in objs if "/packs/" in k]) == 1 and not [k for k in objs if "/index/" in k]
        report = tier_of(s).push()
        assert report.adopted == 1 and report.packs == 0 and report.bytes == 0
        objs = bucket_objects(cfg)
        assert len([k for k in objs if "/packs/" in k]) == 1 and len([k for k in objs if "/index/" in k]) == 1
        assert read_back(cfg, s.config.store_uuid, tmp_path) == {"/run/a.bin": data(2 << 20, 7)}
    assert_clean(path)


PUSH_SCRIPT = """
import sys
from cowfs.store import Store
from cowfs.remote.tier import tier_of
from cowfs.remote import upload
upload.PACK_SIZE = 1 << 20  # many packs: the kill lands between two of them
real = upload._upload_pack
def slow(*a, **k):
    out = real(*a, **k)
    print("pack", flush=True)
    return out
upload._upload_pack = slow
with Store.open(sys.argv[1]) as s:
    tier_of(s).push(stop=None)
"""


def test_push_killed_midway_resumes_without_leaving_garbage(tmp_path, rgw, s3_bucket):
    path = new_store(tmp_path / "s")
    with Store.open(path) as s:
        s.mkdir(ROOT_INO, b"run")
        for k in range(4):
            s.write_file(f"/run/part-{k}.bin", data(2 << 20, 20 + k))
        cfg = configure(s, rgw, s3_bucket.name)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen([sys.executable, "-c", PUSH_SCRIPT, str(path)], stdout=subprocess.PIPE, env=env, text=True)
    try:
        assert proc.stdout.readline().strip() == "pack"
        assert proc.stdout.readline().strip() == "pack"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    with Store.open(path) as s:
        before = {k for k in bucket_objects(cfg) if "/packs/" in k}
        report = tier_of(s).push()
        objs = bucket_objects(cfg)
        packs = {k for k in objs if "/packs/" in k}
        # every pack the killed pass wrote is reused (none written twice), and every pack has its index
        assert before <= packs and all(k.replace("/packs/", "/index/") in objs for k in packs)
        assert sum(objs[k] for k in packs) < 8.2 * (1 << 20)
        assert report.generation == s.generation
        assert read_back(cfg, s.config.store_uuid, tmp_path) == {f"/run/part-{k}.bin": data(2 << 20, 20 + k) for k in range(4)}
    assert_clean(path)


DIE_AFTER_DELTA_SCRIPT = """
import os, signal, sys
from cowfs.store import Store
from cowfs.remote.state import RemoteState
from cowfs.remote.tier import tier_of
real = RemoteState.add_catalog
def die(self, key, *a, **k):
    if key.endswith(".delta.zst"):  # the delta is in the bucket, not yet noted
        os.kill(os.getpid(), signal.SIGKILL)
    real(self, key, *a, **k)
RemoteState.add_catalog = die
with Store.open(sys.argv[1]) as s:
    tier_of(s).push()
"""


def test_a_pass_killed_after_its_delta_went_up_loses_no_change(tmp_path, rgw, s3_bucket):
    """kill -9 between a delta's PUT and its note: the change log was not trimmed, so the next
    delta starts from the last noted generation again and covers every change; the
    unnoted delta is deleted after the next whole catalog."""
    path = new_store(tmp_path / "s")
    with Store.open(path) as s:
        s.mkdir(ROOT_INO, b"run")
        s.write_file("/run/a.bin", data(1 << 20, 60))
        cfg = configure(s, rgw, s3_bucket.name)
        assert tier_of(s).push().whole_key
        s.write_file("/run/b.bin", data(1 << 20, 61))
        s.rename(s.resolve("/run").ino, b"a.bin", s.resolve("/run").ino, b"c.bin")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.run([sys.executable, "-c", DIE_AFTER_DELTA_SCRIPT, str(path)], env=env, timeout=300)
    assert proc.returncode == -signal.SIGKILL
    orphan = [k for k in bucket_objects(cfg) if k.endswith(".delta.zst")]
    assert len(orphan) == 1
    with Store.open(path) as s:
        s.write_file("/run/d.bin", data(1 << 20, 62))
        r = tier_of(s).push()
        assert r.delta_key and r.delta_key not in orphan and r.generation == s.generation
        expect = {"/run/b.bin": data(1 << 20, 61), "/run/c.bin": data(1 << 20, 60), "/run/d.bin": data(1 << 20, 62)}
        assert read_back(cfg, s.config.store_uuid, tmp_path) == expect
        assert tier_of(s).fsck(deep=True)["clean"]
        tier_of(s).push(whole=True)
        assert orphan[0] not in bucket_objects(cfg)
        assert read_back(cfg, s.config.store_uuid, tmp_path) == expect
    assert_clean(path)


def test_gc_and_compaction_between_passes_keep_the_bucket_readable(tmp_path, rgw, s3_bucket):
    path = new_store(tmp_path / "s")
    with Store.open(path) as s:
        s.mkdir(ROOT_INO, b"run")
        cfg = configure(s, rgw, s3_bucket.name)
        for k in range(3):
            s.write_file("/run/m.bin", data(1 << 20, 40 + k))
            s.expire_history()
            s.gc()
            s.compact()
            tier_of(s).push()
            assert read_back(cfg, s.config.store_uuid, tmp_path) == {"/run/m.bin": data(1 << 20, 40 + k)}
    assert_clean(path)


def test_bad_settings_are_one_line_errors_and_change_nothing(tmp_path, rgw, s3_bucket, monkeypatch):
    path = new_store(tmp_path / "s")
    with Store.open(path) as s:
        tier = tier_of(s)
        with pytest.raises(RemoteError, match="does not exist"):
            tier.set(RemoteConfig("s3://no-such-bucket-here/p", endpoint=rgw.credentials.endpoint))
        with pytest.raises(RemoteError, match="cannot reach"):
            tier.set(RemoteConfig(f"s3://{s3_bucket.name}/p", endpoint="http://127.0.0.1:1"))
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
        with pytest.raises(AccessDenied, match="refused the credentials") as e:
            tier.set(RemoteConfig(f"s3://{s3_bucket.name}/p", endpoint=rgw.credentials.endpoint))
        assert "wrong" not in str(e.value) and "\n" not in str(e.value)
        with pytest.raises(InvalidArgument):
            tier.set(RemoteConfig("s3://x/p", endpoint=rgw.credentials.endpoint))
        assert tier.config is None and not (path / "remote.json").exists()
        with pytest.raises(RemoteError, match="no remote set"):
            tier.push()
    assert_clean(path)


def test_large_objects_go_up_in_parts_with_their_checksums_and_a_failed_part_leaves_no_upload(
        tmp_path, rgw, s3_bucket, monkeypatch):
    """Above PART_SIZE an object goes up as a multipart upload whose parts each carry their
    CRC-32; a part that fails aborts the upload (no incomplete upload left behind) and the
    put is one RemoteError line; the next put of the same object succeeds."""
    from cowfs.remote import s3 as s3mod

    bucket = Bucket(RemoteConfig(f"s3://{s3_bucket.name}/big", endpoint=rgw.credentials.endpoint))
    blob = data(2 * s3mod.PART_SIZE + 12345, 9)
    sent: list[tuple[int, str]] = []
    real_part = bucket.client.upload_part

    def recorded(**kw):  # type: ignore[no-untyped-def]
        sent.append((kw["PartNumber"], kw["ChecksumCRC32"]))
        return real_part(**kw)

    monkeypatch.setattr(bucket.client, "upload_part", recorded)
    bucket.put(bucket.key("packs", "a" * 64), blob)
    assert bucket.get(bucket.key("packs", "a" * 64)) == blob
    parts = [blob[k * s3mod.PART_SIZE:(k + 1) * s3mod.PART_SIZE] for k in range(3)]
    assert sorted(sent) == [(k + 1, s3mod._crc32(p)) for k, p in enumerate(parts)]

    def failing(**kw):  # type: ignore[no-untyped-def]
        if kw["PartNumber"] == 2:
            raise ConnectionResetError("the engine went away (test)")
        return real_part(**kw)

    monkeypatch.setattr(bucket.client, "upload_part", failing)
    with pytest.raises(RemoteError) as err:
        bucket.put(bucket.key("packs", "b" * 64), blob)
    assert "\n" not in str(err.value) and "ConnectionResetError" in str(err.value)
    assert not list(bucket.incomplete_uploads(bucket.key("")))
    assert not bucket.exists(bucket.key("packs", "b" * 64))
    monkeypatch.setattr(bucket.client, "upload_part", real_part)
    bucket.put(bucket.key("packs", "b" * 64), blob)
    assert bucket.get(bucket.key("packs", "b" * 64)) == blob


def test_a_whole_catalog_every_max_deltas_and_the_chain_before_the_previous_one_goes(tmp_path, rgw, s3_bucket,
                                                                                       monkeypatch):
    from cowfs.remote import upload
    monkeypatch.setattr(upload, "MAX_DELTAS", 2)
    path = new_store(tmp_path / "s")
    with Store.open(path) as s:
        s.mkdir(ROOT_INO, b"run")
        cfg = configure(s, rgw, s3_bucket.name)
        wholes: list[int] = []
        told: list[tuple[int, str, list[str]]] = []
        timeline: list[str] = []  # "tell", and "copy" when a pass reads a whole copy of the catalog
        take = upload.deltas.take

        def tell(gen: int, key: str, inline: Inline) -> None:  # what the bucket holds when consumers are told
            timeline.append("tell")
            told.append((gen, key, [k for k in bucket_objects(cfg) if "/catalog/" in k]))
            # what a notice may carry: the object told of, and the indexes of the pass's packs, as PUT
            assert inline.catalog == Bucket(cfg).get(key)
            assert inline.indexes and all(Bucket(cfg).get(Bucket(cfg).key("index", n)) == v
                                          for n, v in inline.indexes.items())

        def taking(store, since, delta, base):  # type: ignore[no-untyped-def]
            if base is not None:
                timeline.append("copy")
            return take(store, since, delta, base)

        monkeypatch.setattr(upload.deltas, "take", taking)
        for k in range(7):
            s.write_file(f"/run/f{k}.bin", data(50_000, 80 + k))
            start = len(timeline)
            r = tier_of(s).push(on_catalog=tell)
            assert r.delta_key or k == 0
            assert r.told and told[-1][:2] == (r.generation, r.catalog_key)
            assert r.catalog_key == (r.delta_key or r.whole_key) and r.catalog_key in told[-1][2]
            if r.whole_key:
                wholes.append(r.generation)
                if r.delta_key:  # a whole catalog due: told of the delta before the copy was even read
                    assert timeline[start:] == ["tell", "copy"] and r.whole_key not in told[-1][2]
        assert len(wholes) == 3  # the first pass, then every second delta
        names = [k.rsplit("/", 1)[-1] for k in bucket_objects(cfg) if "/catalog/" in k]
        # kept: the whole catalog before the newest and everything from it on
        assert min(int(n[:16]) for n in names) == wholes[-2]
        assert sorted(int(n[:16]) for n in names if n.endswith(".db.zst")) == wholes[-2:]
        s.write_file("/run/g.bin", data(50_000, 90))
        start = len(timeline)
        r = tier_of(s).push(whole=True, on_catalog=tell)  # remote gc's pass: one pass, the delta told first
        assert r.delta_key and r.whole_key and told[-1][1] == r.delta_key and r.whole_key not in told[-1][2]
        assert timeline[start:] == ["copy", "tell"]  # (one read: the copy comes with the delta)
        wholes.append(r.generation)
        names = [k.rsplit("/", 1)[-1] for k in bucket_objects(cfg) if "/catalog/" in k]
        assert {int(n[:16]) for n in names} == {r.generation}  # remote gc's pass keeps nothing older
        assert read_back(cfg, s.config.store_uuid, tmp_path) == {
            **{f"/run/f{k}.bin": data(50_000, 80 + k) for k in range(7)}, "/run/g.bin": data(50_000, 90)}
    assert_clean(path)
