"""Capacity against the real RGW: with a limit on the local log, segments already in the bucket
are evicted after an upload pass and fetched (ranged GETs, checked) when read; a history
larger than the local disk; a crash in the middle of an eviction; gc of evicted segments;
a missing pack; fetching everything back."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from cowfs.errors import CorruptData, RemoteError
from cowfs.remote.config import RemoteConfig
from cowfs.remote.tier import tier_of
from cowfs.service_remote import pack_reader
from cowfs.store import ROOT_INO, Store
from cowfs.store.log.evicted import evicted_ids, map_path, read_map
from cowfs.store.log.layout import segment_path
from cowfs.store.upkeep import evict as engine_evict
from cowfs.store.upkeep.stats import physical_bytes
from tests.support.mountutil import cowfs, mounted, small_fs
from tests.support.remoteutil import pack_names, wait_older
from tests.support.storeutil import assert_clean, data, new_store

SEGMENT = 4 << 20
UPLOAD_DEADLINE = 120.0  # seconds: generous, the machine may be busy


pytestmark = pytest.mark.usefixtures("aws_env")  # the engine's keys in AWS_* (conftest.py)


def limited(store: Store, rgw, bucket: str, limit: int | None, prefix: str = "p") -> RemoteConfig:
    cfg = RemoteConfig(f"s3://{bucket}/{prefix}", endpoint=rgw.credentials.endpoint, local_limit=limit,
                       fetch_cache=16 << 20)
    tier_of(store).set(cfg)
    return cfg


def open_store(path: Path) -> Store:
    return Store.open(path, pack_reader=pack_reader)


def write_series(s: Store, n: int, size: int, seed: int = 0) -> dict[str, bytes]:
    out = {}
    for k in range(n):
        out[f"/run/ckpt-{k}.bin"] = data(size, seed + k)
        s.write_file(f"/run/ckpt-{k}.bin", out[f"/run/ckpt-{k}.bin"])
    return out


def test_segments_in_the_bucket_are_evicted_and_read_back(tmp_path, rgw, s3_bucket):
    path = new_store(tmp_path / "s", segment_size=SEGMENT)
    with open_store(path) as s:
        s.mkdir(ROOT_INO, b"run")
        files = write_series(s, 6, 3 << 20)
        before = physical_bytes(path)
        limited(s, rgw, s3_bucket.name, 8 << 20)
        report = tier_of(s).push()
        ev = report.evicted
        assert ev is not None and ev["segments"] >= 2, ev
        assert 0 < ev["current_bytes"] <= ev["bytes"], ev  # every file is current: each evicted byte is
        assert physical_bytes(path) == ev["local_bytes"] <= 8 << 20 < before
        assert len(evicted_ids(path)) == ev["evicted_total"] == ev["segments"]
        for seg_id in evicted_ids(path):
            assert not segment_path(path, seg_id).exists()
        for name, blob in files.items():  # fetched from the packs, every record checked
            assert s.read_file(name) == blob
        status = tier_of(s).status()
        assert status["evicted_segments"] == ev["segments"] and status["local_limit"] == 8 << 20
        # a second pass with nothing new evicts nothing more and keeps every read working
        again = tier_of(s).push()
        assert again.skipped and again.evicted["segments"] == 0
    with open_store(path) as s:  # a new process: the maps alone say where the records are
        for name, blob in files.items():
            assert s.read_file(name) == blob
        report = s.fsck()
        assert report.clean and report.segments_evicted == ev["evicted_total"]
        # fetch back: every segment local again, no limit any more
        r = tier_of(s).fetch_back()
        assert r["segments"] == ev["evicted_total"] and not evicted_ids(path)
        assert tier_of(s).config.local_limit is None
    with Store.open(path) as s:  # no remote reader needed any more
        for name, blob in files.items():
            assert s.read_file(name) == blob
    assert_clean(path)


def test_a_history_larger_than_the_local_disk(tmp_path, rgw, s3_bucket):
    """A 48 MiB disk keeps 20 versions of 4 MiB (80 MiB) of new content each, with snapshots."""
    with small_fs(tmp_path / "disk", "48M") as disk:
        path = new_store(disk / "s", segment_size=SEGMENT)
        versions = []
        with open_store(path) as s:
            s.mkdir(ROOT_INO, b"run")
            limited(s, rgw, s3_bucket.name, 12 << 20)
            for k in range(20):
                versions.append(data(4 << 20, 100 + k))
                s.write_file("/run/model.pt", versions[-1])
                s.snapshot_create(f"v{k}")
                ev = tier_of(s).push().evicted
                assert ev is not None and ev["current_bytes"] == 0, "only what the snapshots read goes"
                assert physical_bytes(path) <= 16 << 20, "one segment over the limit at most (the head)"
            st = os.statvfs(disk)
            assert sum(map(len, versions)) > st.f_blocks * st.f_frsize
            for k in (0, 7, 19, 3):
                assert s.read_file("/run/model.pt", gen=s.snapshot(f"v{k}").gen) == versions[k]
        assert_clean(path)


def test_a_crash_after_the_map_is_written_finishes_the_eviction_at_open(tmp_path, rgw, s3_bucket):
    path = new_store(tmp_path / "s", segment_size=SEGMENT)
    with open_store(path) as s:
        s.mkdir(ROOT_INO, b"run")
        files = write_series(s, 4, 3 << 20)
        limited(s, rgw, s3_bucket.name, None)
        tier_of(s).push()

        class Crash(Exception):
            pass

        real_write_map = engine_evict.write_map

        def crash(root, emap):  # the process dies between the map and the deletion of the file
            real_write_map(root, emap)
            raise Crash()

        seg_id = engine_evict.local_segments(s)[0][0]
        with pytest.MonkeyPatch.context() as patch, pytest.raises(Crash):
            patch.setattr(engine_evict, "write_map", crash)
            tier_of(s).set(RemoteConfig(tier_of(s).config.url, endpoint=rgw.credentials.endpoint, local_limit=1 << 20))
            tier_of(s).push()
        assert map_path(path, seg_id).exists() and segment_path(path, seg_id).exists()
    with open_store(path) as s:  # recovery: the map is whole, so the file goes
        assert not segment_path(path, seg_id).exists() and read_map(path, seg_id) is not None
        for name, blob in files.items():
            assert s.read_file(name) == blob
    assert_clean(path)


def test_gc_of_an_evicted_segment_deletes_its_map(tmp_path, rgw, s3_bucket):
    path = new_store(tmp_path / "s", segment_size=SEGMENT)
    with open_store(path) as s:
        s.mkdir(ROOT_INO, b"run")
        write_series(s, 5, 3 << 20)
        limited(s, rgw, s3_bucket.name, 1 << 20)
        tier_of(s).push()
        gone = set(evicted_ids(path))
        assert gone
        for k in range(5):
            s.unlink(s.lookup(ROOT_INO, b"run").ino, f"ckpt-{k}.bin".encode())
        s.write_file("/run/new.bin", data(1 << 20, 99))
        s.expire_history()  # the deleted files' versions go (nothing else kept them)
        s.gc()
        assert not (gone & evicted_ids(path)), "the evicted segments held only dead chunks"
        for seg_id in gone:
            assert not map_path(path, seg_id).exists()
        assert s.read_file("/run/new.bin") == data(1 << 20, 99)
    assert_clean(path)


def test_a_missing_pack_gives_corrupt_data_and_the_remote_cannot_be_dropped(tmp_path, rgw, s3_bucket):
    path = new_store(tmp_path / "s", segment_size=SEGMENT)
    with open_store(path) as s:
        s.mkdir(ROOT_INO, b"run")
        files = write_series(s, 4, 3 << 20)
        cfg = limited(s, rgw, s3_bucket.name, 1 << 20)
        tier_of(s).push()
        # the remote cannot be unset or moved while segments live only in the bucket
        with pytest.raises(RemoteError, match="kept only in"):
            tier_of(s).unset()
        with pytest.raises(RemoteError, match="kept only in"):
            tier_of(s).set(RemoteConfig(f"s3://{s3_bucket.name}/other", endpoint=rgw.credentials.endpoint))
        assert tier_of(s).config == cfg
        emap = read_map(path, sorted(evicted_ids(path))[0])
        s3_bucket.client.delete_object(Bucket=s3_bucket.name, Key=f"p/packs/{emap.packs[0][0]}")
    with open_store(path) as s:  # no block of it cached in this process
        results = []
        for name, blob in files.items():
            try:
                results.append(s.read_file(name) == blob)
            except CorruptData as e:
                assert "missing from the bucket" in str(e)
                results.append(None)
        assert None in results and all(r in (True, None) for r in results)


def test_a_mounted_store_evicts_in_the_background(tmp_path, rgw, s3_bucket):
    store_path = new_store(tmp_path / "s", segment_size=SEGMENT)
    url = f"s3://{s3_bucket.name}/m"
    out = cowfs("remote", "set", str(store_path), url, "--endpoint", rgw.credentials.endpoint,
                "--local-limit", "8M").stdout.decode()
    assert "evicted" in out
    blobs = {k: data(3 << 20, 40 + k) for k in range(6)}
    with mounted(store_path, tmp_path / "mnt") as mnt:
        (mnt / "run").mkdir()
        for k, blob in blobs.items():
            (mnt / "run" / f"ckpt-{k}.bin").write_bytes(blob)
        deadline = time.monotonic() + UPLOAD_DEADLINE
        while True:  # the daemon uploads after each close, then evicts down to the limit
            s = json.loads(cowfs("remote", "status", str(mnt), "--json").stdout)
            if s["catalog_generation"] == s["generation"] and s["local_bytes"] <= 8 << 20:
                break
            assert time.monotonic() < deadline, f"not evicted in {UPLOAD_DEADLINE} s: {s}"
            time.sleep(0.2)
        assert s["evicted_segments"] >= 2
        assert "kept only in the bucket" in cowfs("remote", "status", str(mnt)).stdout.decode()
    with mounted(store_path, tmp_path / "mnt") as mnt:  # a new daemon: nothing in the kernel's cache
        for k, blob in blobs.items():
            assert (mnt / "run" / f"ckpt-{k}.bin").read_bytes() == blob
        bad = cowfs("remote", "unset", str(mnt), check=False)
        err = bad.stderr.decode()
        assert bad.returncode != 0 and "kept only in" in err and err.count("\n") == 1
        assert "fetched back" in cowfs("remote", "fetch", str(mnt)).stdout.decode()
        s = json.loads(cowfs("remote", "status", str(mnt), "--json").stdout)
        assert s["evicted_segments"] == 0 and s["local_limit"] is None
        for k, blob in blobs.items():
            assert (mnt / "run" / f"ckpt-{k}.bin").read_bytes() == blob
    assert not evicted_ids(store_path)
    assert_clean(store_path)


def test_remote_gc_keeps_every_pack_an_evicted_chunk_row_needs(tmp_path, rgw, s3_bucket):
    """Evicted segments are read from packs; remote gc may delete only packs no retained
    catalog lists a chunk of. A file deleted without a local gc leaves its chunk rows (in
    evicted segments): a new write can deduplicate against them, so their pack must stay."""
    path = new_store(tmp_path / "s", segment_size=SEGMENT)
    with open_store(path) as s:
        s.mkdir(ROOT_INO, b"run")
        cfg = limited(s, rgw, s3_bucket.name, 1 << 20)
        blobs = {name: data(3 << 20, 60 + k) for k, name in enumerate(("a", "b", "c"))}
        packs = {}
        for name, blob in blobs.items():  # one pack each
            before = pack_names(cfg)
            s.write_file(f"/run/{name}", blob)
            tier_of(s).push()
            packs[name] = pack_names(cfg) - before
        assert all(packs.values()) and evicted_ids(path)
        run = s.lookup(ROOT_INO, b"run").ino

        def cycle_catalogs() -> None:  # new generations until the bucket keeps none older
            for _ in range(3):
                s.mkdir(ROOT_INO, f"g{s.generation}".encode())
                tier_of(s).push()

        s.unlink(run, b"b")
        s.unlink(run, b"c")
        s.expire_history()  # no local gc: the chunk rows of b and c stay, in evicted segments
        cycle_catalogs()
        wait_older(cfg, "packs", 2)
        assert tier_of(s).gc(grace=2)["marked_packs"] == 0, "packs of chunk rows still in the catalog"
        s.write_file("/run/b", blobs["b"])  # deduplicated against b's evicted rows
        assert tier_of(s).push().bytes == 0
        assert s.read_file("/run/b") == blobs["b"]
        s.gc()  # now c's rows go
        cycle_catalogs()
        first = tier_of(s).gc(grace=2)
        assert first["marked_packs"] == len(packs["c"]), first
        wait_older(cfg, "gc", 2)
        second = tier_of(s).gc(grace=2)
        assert second["deleted_packs"] == len(packs["c"]), second
        assert pack_names(cfg) == packs["a"] | packs["b"]
        assert s.read_file("/run/a") == blobs["a"] and s.read_file("/run/b") == blobs["b"]
        assert tier_of(s).fsck(deep=True)["clean"]
    assert_clean(path)


def test_the_block_cache_serves_blocks_its_disk_lost_or_cannot_keep(tmp_path, rgw, s3_bucket):
    """Fetched pack blocks go to readers first and to the cache's disk after; a block file
    deleted behind the cache's back is fetched again, and a cache directory
    that cannot be written still serves every block."""
    from cowfs.remote.replica import BLOCK, BlockCache
    from cowfs.remote.s3 import Bucket

    cfg = RemoteConfig(f"s3://{s3_bucket.name}/b", endpoint=rgw.credentials.endpoint)
    bucket = Bucket(cfg)
    blob = data(3 * BLOCK + 100, 7)
    bucket.put(bucket.key("packs", "p" * 64), blob)
    cache = BlockCache(tmp_path / "blocks", bucket, 64 << 20)
    try:
        assert cache.block("p" * 64, 1, len(blob)) == blob[BLOCK:2 * BLOCK]
        cache.writer.submit(lambda: None).result()  # the writes queued before it are done
        stored = tmp_path / "blocks" / ("p" * 64) / "1"
        assert stored.read_bytes()[:-4] == blob[BLOCK:2 * BLOCK]
        stored.unlink()
        cache._recent.clear()  # as after a restart: only the disk knows of the block
        before = cache.fetched_bytes
        assert cache.block("p" * 64, 1, len(blob)) == blob[BLOCK:2 * BLOCK]
        assert cache.fetched_bytes == before + BLOCK
    finally:
        cache.close()
    # a cache directory that is a file: nothing can be cached, everything is served
    (tmp_path / "not-a-dir").write_bytes(b"")
    cache = BlockCache(tmp_path / "cache2", bucket, 64 << 20)
    cache.root = tmp_path / "not-a-dir"
    try:
        for n in range(4):
            assert cache.block("p" * 64, n, len(blob)) == blob[n * BLOCK:(n + 1) * BLOCK]
        cache.writer.submit(lambda: None).result()
        assert not cache._sizes
    finally:
        cache.close()


def test_blocks_read_ahead_come_in_runs_of_one_get_and_a_drop_mid_run_fails_only_the_rest(tmp_path, rgw, s3_bucket):
    """Read-ahead asks for blocks n..m: each run of missing blocks is one ranged GET of up to
    GET_BLOCKS blocks, each block handed over as it arrives; a connection dropped after the
    first block of a run fails only the blocks not yet arrived, and they are fetched again."""
    from cowfs.errors import RemoteError as Dropped
    from cowfs.remote.replica import BLOCK, GET_BLOCKS, BlockCache
    from cowfs.remote.s3 import Bucket

    bucket = Bucket(RemoteConfig(f"s3://{s3_bucket.name}/r", endpoint=rgw.credentials.endpoint))
    pack = "r" * 64
    blob = data(9 * BLOCK + 100, 8)  # 10 blocks, the last one short
    bucket.put(bucket.key("packs", pack), blob)
    gets: list[tuple[int, int]] = []
    real = bucket.range_pieces

    def counted(key, start, length, piece):  # type: ignore[no-untyped-def]
        gets.append((start // BLOCK, length))
        return real(key, start, length, piece)

    bucket.range_pieces = counted  # type: ignore[method-assign]
    cache = BlockCache(tmp_path / "blocks", bucket, 256 << 20)
    try:
        assert cache.block(pack, 1, len(blob)) == blob[BLOCK:2 * BLOCK]  # a miss: one block alone
        cache.prefetch(pack, 0, 12, len(blob))  # past the end: clamped to the pack's last block
        waiting = dict(cache._fetching)
        for f in waiting.values():
            f.result(timeout=60)
        assert gets[0] == (1, BLOCK)
        runs = sorted(gets[1:])  # the pool's threads GET them in any order
        assert runs == [(0, BLOCK), (2, GET_BLOCKS * BLOCK), (2 + GET_BLOCKS, 3 * BLOCK + 100)], gets
        for n in range(10):
            assert cache.block(pack, n, len(blob)) == blob[n * BLOCK:(n + 1) * BLOCK]
        cache.prefetch(pack, 0, 9, len(blob))
        assert len(gets) == 4 and not cache._fetching  # all there: nothing fetched again
    finally:
        cache.close()

    def dropping(key, start, length, piece):  # type: ignore[no-untyped-def]
        pieces = real(key, start, length, piece)
        yield next(pieces)
        pieces.close()
        raise Dropped("the connection dropped while reading (test)")

    bucket.range_pieces = dropping  # type: ignore[method-assign]
    cache = BlockCache(tmp_path / "blocks2", bucket, 256 << 20)
    try:
        cache.prefetch(pack, 0, GET_BLOCKS - 1, len(blob))
        futures = [cache._fetching[(pack, n)] for n in range(GET_BLOCKS)]
        assert futures[0].result(timeout=60) == blob[:BLOCK]
        for f in futures[1:]:
            with pytest.raises(Dropped):
                f.result(timeout=60)
        assert not cache._fetching
        bucket.range_pieces = real  # type: ignore[method-assign]
        for n in range(GET_BLOCKS):  # the failed ones are fetched again on demand
            assert cache.block(pack, n, len(blob)) == blob[n * BLOCK:(n + 1) * BLOCK]
    finally:
        cache.close()


def test_the_block_cache_writes_without_o_direct_where_it_is_refused_and_skips_writes_when_behind(
        tmp_path, rgw, s3_bucket, monkeypatch):
    """A cache directory on a file system that refuses O_DIRECT (EINVAL at open) still keeps
    whole, checked blocks (written through the page cache); with MAX_PENDING_WRITES blocks
    already waiting for the disk, a fetched block is served and not cached."""
    import errno as _errno

    from cowfs.remote import replica
    from cowfs.remote.replica import BLOCK, BlockCache
    from cowfs.remote.s3 import Bucket

    bucket = Bucket(RemoteConfig(f"s3://{s3_bucket.name}/w", endpoint=rgw.credentials.endpoint))
    pack = "w" * 64
    blob = data(2 * BLOCK + 7, 11)
    bucket.put(bucket.key("packs", pack), blob)
    real_open = os.open
    refused: list[str] = []

    def no_direct(path, flags, mode=0o777, *, dir_fd=None):  # type: ignore[no-untyped-def]
        if flags & os.O_DIRECT:
            refused.append(str(path))
            raise OSError(_errno.EINVAL, "O_DIRECT refused (test)")
        return real_open(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(replica.os, "open", no_direct)
    cache = BlockCache(tmp_path / "blocks", bucket, 64 << 20)
    try:
        for n in range(3):
            assert cache.block(pack, n, len(blob)) == blob[n * BLOCK:(n + 1) * BLOCK]
        cache.writer.submit(lambda: None).result()
        for n in range(3):
            raw = (tmp_path / "blocks" / pack / str(n)).read_bytes()
            assert raw[:-4] == blob[n * BLOCK:(n + 1) * BLOCK]
            assert raw[-4:] == replica._native.crc32(raw[:-4]).to_bytes(4, "little")
        assert sorted(cache._sizes) == [(pack, n) for n in range(3)] and len(refused) == 3
    finally:
        cache.close()
    monkeypatch.setattr(replica, "MAX_PENDING_WRITES", 0)
    cache = BlockCache(tmp_path / "blocks2", bucket, 64 << 20)
    try:
        assert cache.block(pack, 2, len(blob)) == blob[2 * BLOCK:]
        cache.writer.submit(lambda: None).result()
        assert not cache._sizes and not (tmp_path / "blocks2" / pack).exists()
    finally:
        cache.close()
