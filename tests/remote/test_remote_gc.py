"""Remote gc (mark, then sweep after a grace period) and the bucket fsck, against the real
RGW: stores sharing a prefix keep every pack either uses; a pass racing a mark uploads again
what the mark doomed, so deleting the doomed pack loses nothing; a sweep cut short between
an index and its pack is finished by the next; fsck names the paths a missing or damaged
pack affects. Ages are waited for on the engine's clock (tests/support/remoteutil.wait_older)."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Iterator

import pytest

from cowfs.errors import CorruptData, RemoteError
from cowfs.remote import gc as remote_gc
from cowfs.remote import upload
from cowfs.remote.bucket_look import INDEX_EVERY
from cowfs.remote.config import RemoteConfig
from cowfs.remote.doomed import CLOCK_STEP
from cowfs.remote.s3 import Bucket
from cowfs.remote.source import ReplicaSource
from cowfs.remote.state import RemoteState
from cowfs.remote.tier import tier_of
from cowfs.store import ROOT_INO, Store
from tests.support.mountutil import cowfs, mounted
from tests.support.remoteutil import (bucket_objects, configure, delete_pack, one_store, pack_names, put_file, read_back,
                                     wait_older)
from tests.support.storeutil import assert_clean, data, new_store

GRACE = 2.0  # the shortest the protocol allows (doomed.MIN_GRACE)
DEADLINE = 120.0


pytestmark = pytest.mark.usefixtures("aws_env")  # the engine's keys in AWS_* (conftest.py)


def forget(s: Store, *names: str) -> None:
    """Delete /run/NAME..., drop their history and collect locally, then push a whole catalog
    (what remote gc's own pass does), which deletes the store's older catalog objects."""
    run = s.resolve("/run").ino
    for name in names:
        s.unlink(run, name.encode())
    s.expire_history()
    s.gc()
    tier_of(s).push(whole=True)


def keys(cfg: RemoteConfig, kind: str) -> list[str]:
    return sorted(k for k in bucket_objects(cfg) if f"/{kind}/" in k)


class Hand:
    """A store's bucket and remote.db, to run gc's steps one at a time."""

    def __init__(self, s: Store) -> None:
        self.s = s
        self.bucket = tier_of(s).bucket()
        self.state = RemoteState(s.root / "remote.db", self.bucket.cfg.url)

    def mark(self) -> remote_gc.GcReport:
        r = remote_gc.GcReport(grace_seconds=GRACE)
        remote_gc.mark(self.bucket, self.state, self.s.root / "tmp", GRACE, self.s.config.store_uuid, r)
        return r

    def sweep(self) -> remote_gc.GcReport:
        r = remote_gc.GcReport(grace_seconds=GRACE)
        remote_gc.sweep(self.bucket, self.state, self.s.root / "tmp", GRACE, r)
        return r


@pytest.fixture
def hands() -> Iterator[list[Hand]]:
    made: list[Hand] = []
    yield made
    for h in made:
        h.state.close()


def hand(s: Store, hands: list[Hand]) -> Hand:
    hands.append(Hand(s))
    return hands[-1]


@pytest.mark.long
def test_two_stores_sharing_a_prefix_keep_what_either_uses(tmp_path, rgw, s3_bucket):
    common, only1, only2 = data(2 << 20, 1), data(2 << 20, 2), data(2 << 20, 3)
    p1, p2 = new_store(tmp_path / "s1"), new_store(tmp_path / "s2")
    with Store.open(p1) as s1, Store.open(p2) as s2:
        cfg = configure(s1, rgw, s3_bucket.name, prefix="shared")
        configure(s2, rgw, s3_bucket.name, prefix="shared")
        for s in (s1, s2):
            s.mkdir(ROOT_INO, b"run")
        shared = put_file(s1, "common.bin", common)
        mine = put_file(s1, "only1.bin", only1)
        s2.write_file("/run/common.bin", common)
        others = put_file(s2, "only2.bin", only2)
        assert shared and mine and others and pack_names(cfg) == shared | mine | others  # common went up once
        forget(s1, "common.bin", "only1.bin")
        uuid1, uuid2 = s1.config.store_uuid, s2.config.store_uuid
    wait_older(cfg, "packs", GRACE)
    first = json.loads(cowfs("remote", "gc", str(p1), "--grace", "2s", "--json").stdout)
    assert (first["marked_packs"], first["swept_lists"], first["deleted_packs"]) == (len(mine), 0, 0)
    # the live set read every catalog object of both stores, whole ones and deltas
    assert first["catalogs"] == len(keys(cfg, "catalog")) and first["doomed_list"] in bucket_objects(cfg)
    assert any(k.endswith(".delta.zst") for k in keys(cfg, "catalog"))
    assert pack_names(cfg) == shared | mine | others  # marked, not deleted
    consumer = ReplicaSource(tmp_path / "cache", cfg, uuid2)  # what a consumer of store 2 knows of the bucket
    consumer.learn_indexes()
    wait_older(cfg, "gc", GRACE)
    second = cowfs("remote", "gc", str(p1), "--grace", "2s").stdout.decode()
    assert f"swept 1 doomed lists: {len(mine)} packs" in second and "0 kept" in second, second
    assert "no unused pack older than the grace period to mark" in second, second
    assert pack_names(cfg) == shared | others  # only the packs nothing but s1's old versions used went
    assert keys(cfg, "index") == sorted(Bucket(cfg).key("index", n) for n in shared | others)
    assert not keys(cfg, "gc")
    assert consumer.shared.state.known_packs() == shared | mine | others
    consumer.learn_indexes()  # at its next catalog fetch it forgets the packs gc deleted
    assert consumer.shared.state.known_packs() == shared | others
    consumer.close()
    assert read_back(cfg, uuid2, tmp_path) == {"/run/common.bin": common, "/run/only2.bin": only2}
    assert read_back(cfg, uuid1, tmp_path) == {}  # s1's newest generation: /run, empty
    for p in (p1, p2):
        assert cowfs("remote", "fsck", str(p), "--deep").returncode == 0
    with mounted(p2, tmp_path / "mnt") as mnt:  # through the daemon: gc and fsck as requests
        assert (mnt / "run" / "only2.bin").read_bytes() == only2
        third = json.loads(cowfs("remote", "gc", str(mnt), "--grace", "2s", "--json").stdout)
        assert third["deleted_packs"] == 0 and third["marked_packs"] == 0
        out = cowfs("remote", "fsck", str(mnt)).stdout.decode()
        assert out.startswith("remote fsck: clean"), out
    for p in (p1, p2):
        assert_clean(p)


def test_a_chunk_needed_again_after_its_pack_was_marked_goes_up_again(tmp_path, rgw, s3_bucket, hands):
    blob = data(2 << 20, 10)
    s, cfg = one_store(tmp_path, rgw, s3_bucket)
    with s:
        (old,) = put_file(s, "a.bin", blob)
        forget(s, "a.bin")
        wait_older(cfg, "packs", GRACE)
        assert hand(s, hands).mark().marked_packs == 1
        # the same bytes again: the pass counts the doomed pack's chunks as not in the bucket,
        # and the new pack gets another name (its records in reverse order), since a sweep may
        # delete whatever is under the doomed name
        s.write_file("/run/again.bin", blob)
        r = tier_of(s).push()
        assert r.packs == 1 and r.bytes > len(blob)
        (new,) = pack_names(cfg) - {old}
        assert tier_of(s).status()["doomed_packs"] == 1
        wait_older(cfg, "gc", GRACE)
        swept = hands[0].sweep()  # the old pack holds chunks a retained catalog uses again: kept
        assert (swept.swept_lists, swept.kept_packs, swept.deleted_packs) == (1, 1, 0)
        assert pack_names(cfg) == {old, new} and not keys(cfg, "gc")
        delete_pack(cfg, old)  # what a sweep that missed the new catalog would have done: nothing is lost
        assert read_back(cfg, s.config.store_uuid, tmp_path) == {"/run/again.bin": blob}
        assert tier_of(s).fsck(deep=True)["clean"]
    assert_clean(s.root)


@pytest.mark.parametrize("when", ["before the pass looks again", "during the catalog's PUT"])
def test_a_mark_during_a_pass_that_deduplicated_against_the_pack(when, tmp_path, rgw, s3_bucket, hands, monkeypatch):
    """The race the protocol guards against, step by step: store 2's pass finds the chunks in
    store 1's pack (not doomed yet) and uploads nothing; store 1's gc marks that pack; the pass
    then puts a catalog that needs it. A sweep whose live set was read before that catalog
    went up would delete the pack: the pass must not rely on it."""
    blob, small = data(2 << 20, 11), data(100_000, 12)
    s1, cfg = one_store(tmp_path, rgw, s3_bucket, "s1")
    s2, _ = one_store(tmp_path, rgw, s3_bucket, "s2")
    with s1, s2:
        (doomed,) = put_file(s1, "a.bin", blob)
        forget(s1, "a.bin")
        wait_older(cfg, "packs", GRACE)
        gc1 = hand(s1, hands)
        marks: list[remote_gc.GcReport] = []
        where, hook = (upload.deltas, "take") if when.startswith("before") else (upload, "_put_catalog")
        real = getattr(where, hook)

        def mark_then(*args, **kwargs):  # store 1's gc runs while store 2's pass is under way
            if not marks:
                marks.append(gc1.mark())
            return real(*args, **kwargs)

        monkeypatch.setattr(where, hook, mark_then)
        s2.write_file("/run/a.bin", blob)
        s2.write_file("/run/small.bin", small)
        r = tier_of(s2).push()
        assert marks[0].marked_packs == 1 and r.catalog_key
        delete_pack(cfg, doomed)  # what a sweep that read the catalogs before store 2's went up does
        assert read_back(cfg, s2.config.store_uuid, tmp_path) == {"/run/a.bin": blob, "/run/small.bin": small}
        assert r.reuploaded > 0  # the pass uploaded the doomed pack's chunks again, under another name
        assert tier_of(s2).fsck(deep=True)["clean"]
    for s in (s1, s2):
        assert_clean(s.root)


def test_a_catalog_whose_marked_chunks_are_gone_locally_is_withdrawn(tmp_path, rgw, s3_bucket, hands, monkeypatch):
    """The mark lands during the catalog's PUT and the store has meanwhile dropped the chunks
    the pass found in the doomed pack: they cannot go up again, so the catalog object is
    deleted and the pass fails; the next one uploads a newer generation."""
    blob, small = data(2 << 20, 13), data(100_000, 14)
    s1, cfg = one_store(tmp_path, rgw, s3_bucket, "s1")
    s2, _ = one_store(tmp_path, rgw, s3_bucket, "s2")
    with s1, s2:
        put_file(s1, "a.bin", blob)
        forget(s1, "a.bin")
        put_file(s2, "small.bin", small)
        before = keys(cfg, s2.config.store_uuid)
        wait_older(cfg, "packs", GRACE)
        gc1 = hand(s1, hands)
        real = upload._put_catalog
        done: list[bool] = []

        def mark_and_drop_then_put(*args, **kwargs):
            if not done:  # before the pass's first catalog object goes up
                done.append(True)
                gc1.mark()
                run = s2.resolve("/run").ino
                s2.unlink(run, b"a.bin")
                s2.expire_history()
                s2.gc()
            return real(*args, **kwargs)

        s2.write_file("/run/a.bin", blob)
        monkeypatch.setattr(upload, "_put_catalog", mark_and_drop_then_put)
        with pytest.raises(RemoteError, match="no longer holds them"):
            tier_of(s2).push()
        monkeypatch.setattr(upload, "_put_catalog", real)
        assert keys(cfg, s2.config.store_uuid) == before  # the catalog needing the doomed pack is gone
        assert read_back(cfg, s2.config.store_uuid, tmp_path) == {"/run/small.bin": small}
        r = tier_of(s2).push()
        assert r.generation == s2.generation and r.bytes == 0
        assert read_back(cfg, s2.config.store_uuid, tmp_path) == {"/run/small.bin": small}
    for s in (s1, s2):
        assert_clean(s.root)


def test_a_sweep_cut_short_between_an_index_and_its_pack_is_finished(tmp_path, rgw, s3_bucket, monkeypatch):
    a, b = data(2 << 20, 15), data(2 << 20, 16)
    s, cfg = one_store(tmp_path, rgw, s3_bucket)
    with s:
        (pa,) = put_file(s, "a.bin", a)
        (pb,) = put_file(s, "b.bin", b)
        forget(s, "a.bin")
        wait_older(cfg, "packs", GRACE)
        assert tier_of(s).gc(GRACE)["marked_packs"] == 1
        wait_older(cfg, "gc", GRACE)
        real = Bucket.delete

        def crash_before_packs(self, keys_):  # the gc's process dies after deleting the indexes
            if any("/packs/" in k for k in keys_):
                raise RemoteError("connection dropped (test)")
            return real(self, keys_)

        monkeypatch.setattr(Bucket, "delete", crash_before_packs)
        with pytest.raises(RemoteError, match="dropped"):
            tier_of(s).gc(GRACE)
        monkeypatch.setattr(Bucket, "delete", real)
        idx = Bucket(cfg).key("index", pa)
        assert pa in pack_names(cfg) and idx not in bucket_objects(cfg) and keys(cfg, "gc")
        r = tier_of(s).push()  # the pack without an index is doomed: left for the sweep, not adopted
        assert r.adopted == 0 and idx not in bucket_objects(cfg)
        g = tier_of(s).gc(GRACE)
        assert (g["swept_lists"], g["deleted_packs"], g["kept_packs"]) == (1, 1, 0)
        assert pack_names(cfg) == {pb} and not keys(cfg, "gc")
        assert read_back(cfg, s.config.store_uuid, tmp_path) == {"/run/b.bin": b}
        assert tier_of(s).fsck()["clean"]
    assert_clean(s.root)


def test_a_pack_put_again_after_the_mark_is_kept_by_the_sweep(tmp_path, rgw, s3_bucket, hands):
    """Another store's pass that had not seen the doomed list may PUT the same bytes again
    (its catalog then needs them): the sweep keeps a pack whose LastModified changed."""
    blob = data(1 << 20, 19)
    s, cfg = one_store(tmp_path, rgw, s3_bucket)
    with s:
        (p,) = put_file(s, "a.bin", blob)
        forget(s, "a.bin")
        wait_older(cfg, "packs", GRACE)
        gc = hand(s, hands)
        assert gc.mark().marked_packs == 1
        bucket = Bucket(cfg)
        key = bucket.key("packs", p)
        (marked,) = [o.modified for o in bucket.list(key)]
        deadline = time.monotonic() + DEADLINE
        while [o.modified for o in bucket.list(key)] == [marked]:  # LastModified may count whole seconds
            assert time.monotonic() < deadline
            bucket.put(key, bucket.get(key))
            time.sleep(0.2)
        wait_older(cfg, "gc", GRACE)
        swept = gc.sweep()
        assert (swept.kept_packs, swept.deleted_packs) == (1, 0) and pack_names(cfg) == {p}
        wait_older(cfg, "packs", GRACE)
        assert gc.mark().marked_packs == 1  # still unused: marked again, and deleted at the next sweep
        wait_older(cfg, "gc", GRACE)
        assert gc.sweep().deleted_packs == 1 and not pack_names(cfg) and not keys(cfg, "index")
    assert_clean(s.root)


def test_packs_whose_index_was_deleted_are_adopted_and_gc_takes_the_unused_one(tmp_path, rgw, s3_bucket):
    a, b = data(2 << 20, 17), data(2 << 20, 18)
    s, cfg = one_store(tmp_path, rgw, s3_bucket)
    with s:
        (pa,) = put_file(s, "a.bin", a)
        (pb,) = put_file(s, "b.bin", b)
        bucket = Bucket(cfg)
        bucket.delete([bucket.key("index", pa), bucket.key("index", pb)])
        looks = tier_of(s).looks
        assert looks.index is not None
        looks.index -= INDEX_EVERY  # as if a second had passed: the next pass lists index/
        forget(s, "a.bin")  # its first pass adopts both packs (nothing doomed them)
        assert keys(cfg, "index") == sorted(bucket.key("index", n) for n in (pa, pb))
        assert read_back(cfg, s.config.store_uuid, tmp_path) == {"/run/b.bin": b}
        wait_older(cfg, "packs", GRACE)
        assert tier_of(s).gc(GRACE)["marked_packs"] == 1
        wait_older(cfg, "gc", GRACE)
        assert tier_of(s).gc(GRACE)["deleted_packs"] == 1
        assert pack_names(cfg) == {pb}
        assert read_back(cfg, s.config.store_uuid, tmp_path) == {"/run/b.bin": b}
    assert_clean(s.root)


def test_bucket_fsck_names_the_paths_a_missing_or_damaged_pack_affects(tmp_path, rgw, s3_bucket):
    blobs = {name: data(1 << 20, 20 + k) for k, name in enumerate(("a.bin", "b.bin", "c.bin"))}
    s, cfg = one_store(tmp_path, rgw, s3_bucket)
    with s:
        packs = {name: put_file(s, name, blob).pop() for name, blob in blobs.items()}
        uuid = s.config.store_uuid
    path = str(s.root)
    assert cowfs("remote", "fsck", path).returncode == 0
    bucket = Bucket(cfg)
    bucket.delete([bucket.key("packs", packs["a.bin"])])
    size = bucket_objects(cfg)[bucket.key("packs", packs["b.bin"])]
    bucket.put(bucket.key("packs", packs["b.bin"]), data(size, 99))  # garbage of the same size
    r = cowfs("remote", "fsck", path, check=False)
    out = r.stdout.decode()
    assert r.returncode == 1 and r.stderr == b"", out
    (line,) = [ln for ln in out.splitlines() if ln.startswith("pack: ")]
    assert f"packs/{packs['a.bin']}: missing from the bucket" in line and "path /run/a.bin;" in line, line
    assert "version " in line and "(generation " in line and "b.bin" not in out  # sizes match: only --deep reads it
    r = cowfs("remote", "fsck", path, "--deep", "--json", check=False)
    report = json.loads(r.stdout)
    assert r.returncode == 1 and not report["clean"] and report["packs_read"] == 2
    lines = report["problems"]
    assert len(lines) == 2 and all(ln.count("\n") == 0 for ln in lines)
    assert "path /run/a.bin;" in lines[0] or "path /run/a.bin;" in lines[1]
    (damaged,) = [ln for ln in lines if packs["b.bin"] in ln]
    assert "damaged records" in damaged and "path /run/b.bin;" in damaged and "c.bin" not in "".join(lines)
    with pytest.raises(CorruptData, match="missing from the bucket|damaged|record"):  # a read of them fails (EIO)
        read_back(cfg, uuid, tmp_path)
    # the way back: delete the damaged pack too; the next pass uploads what the store still
    # holds of both, and remote gc deletes the two indexes left without their packs
    bucket.delete([bucket.key("packs", packs["b.bin"])])
    with Store.open(path) as s:
        r = tier_of(s).push()
        assert (r.forgotten, r.packs) == (2, 1) and r.bytes > 2 << 20
        assert read_back(cfg, uuid, tmp_path) == {f"/run/{n}": b for n, b in blobs.items()}
        report = tier_of(s).fsck(deep=True)
        assert len(report["problems"]) == 2, report
        assert all("missing from the bucket; the " in ln and "chunks the catalogs use from it are in other packs too"
                   in ln for ln in report["problems"]), report
        wait_older(cfg, "index", GRACE)
        assert tier_of(s).gc(GRACE)["marked_packs"] == 2
        wait_older(cfg, "gc", GRACE)
        assert tier_of(s).gc(GRACE)["deleted_packs"] == 2
    assert cowfs("remote", "fsck", path, "--deep").returncode == 0
    assert read_back(cfg, uuid, tmp_path) == {f"/run/{n}": b for n, b in blobs.items()}
    assert_clean(Path(path))


def test_gc_aborts_old_incomplete_uploads_and_deletes_damaged_doomed_lists(tmp_path, rgw, s3_bucket):
    s, cfg = one_store(tmp_path, rgw, s3_bucket)
    with s:
        blob = data(1 << 20, 30)
        put_file(s, "a.bin", blob)
        bucket = Bucket(cfg)
        up = bucket.client.create_multipart_upload(Bucket=s3_bucket.name, Key=bucket.key("packs", "0" * 64))["UploadId"]
        junk = bucket.key("gc", "f" * 64 + ".doomed")
        bucket.put(junk, b"not a doomed list")
        s.write_file("/run/b.bin", blob[::-1])
        assert tier_of(s).push().packs == 1  # a pass ignores the damaged list
        deadline = time.monotonic() + DEADLINE
        while bucket.clock() - max(u.initiated for u in bucket.incomplete_uploads(bucket.key(""))) < GRACE + CLOCK_STEP:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        wait_older(cfg, "gc", GRACE)
        g = tier_of(s).gc(GRACE)
        assert g["aborted_uploads"] == 1 and g["damaged_lists"] == 1 and g["marked_packs"] == 0
        assert up not in [u.upload_id for u in bucket.incomplete_uploads(bucket.key(""))]
        assert junk not in bucket_objects(cfg)
        assert read_back(cfg, s.config.store_uuid, tmp_path) == {"/run/a.bin": blob, "/run/b.bin": blob[::-1]}
    assert_clean(s.root)
