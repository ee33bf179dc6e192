"""Engine tests: namespace, write sessions, snapshots, history, gc, recovery, corruption.

Every test runs on both devices and ends with fsck clean (except where a test
damages the store on purpose, which then checks what fsck says and repairs)."""
from __future__ import annotations

import errno
import os
import sqlite3
import stat

import pytest

from cowfs.errors import Busy, CorruptData, Exists, InvalidArgument, IsADirectory, NotEmpty, NotFound, StoreError
from cowfs.store import ROOT_INO, Store
from cowfs.store.catalog.schema import LIVE
from cowfs.store.log.layout import CATALOG_FILE, FORMAT_VERSION, segment_path
from tests.support.storeutil import assert_clean, data, new_store


@pytest.fixture(params=["file", "direct", "pmem"])
def path(request, tmp_path):
    p = new_store(tmp_path / "store", device=request.param)
    yield p
    if request.node.get_closest_marker("damaged") is None:
        assert_clean(p)


def test_init_refuses_existing_or_nonempty(tmp_path):
    p = new_store(tmp_path / "s")
    before = sorted(os.listdir(p))
    with pytest.raises(StoreError, match="already a cowfs store"):
        Store.init(p)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "x").write_text("keep me")
    with pytest.raises(StoreError, match="not empty"):
        Store.init(tmp_path / "other")
    assert sorted(os.listdir(p)) == before and (tmp_path / "other" / "x").read_text() == "keep me"
    assert_clean(p)


def test_open_errors(tmp_path):
    with pytest.raises(StoreError, match="no such directory"):
        Store.open(tmp_path / "missing")
    (tmp_path / "plain").mkdir()
    with pytest.raises(StoreError, match="not a cowfs store"):
        Store.open(tmp_path / "plain")
    p = new_store(tmp_path / "s")
    cfg = (p / "cowfs-store.json").read_text()
    (p / "cowfs-store.json").write_text(cfg.replace(f'"format_version": {FORMAT_VERSION}', '"format_version": 99'))
    with pytest.raises(StoreError, match="format version 99"):
        Store.open(p)
    (p / "cowfs-store.json").write_text(cfg)
    with Store.open(p):
        with pytest.raises(Busy, match="in use"):
            Store.open(p)
    assert_clean(p)


def test_namespace_operations(path):
    with Store.open(path) as s:
        d = s.mkdir(ROOT_INO, b"run")
        f = s.create(d.ino, b"a.pt", 0o600)
        assert stat.S_ISREG(f.mode) and f.mode & 0o777 == 0o600 and f.size == 0
        with pytest.raises(Exists):
            s.create(d.ino, b"a.pt")
        s.symlink(d.ino, b"last.ckpt", b"a.pt")
        assert s.readlink(s.lookup(d.ino, b"last.ckpt").ino) == b"a.pt"
        assert [n for n, _ in s.readdir(d.ino)] == [b"a.pt", b"last.ckpt"]
        assert s.getattr(ROOT_INO).nlink == 3
        with pytest.raises(NotEmpty):
            s.rmdir(ROOT_INO, b"run")
        with pytest.raises(IsADirectory):
            s.unlink(ROOT_INO, b"run")
        s.write_file("/run/b.pt", b"B" * 100)
        with pytest.raises(Exists):
            s.rename(d.ino, b"a.pt", d.ino, b"b.pt", noreplace=True)
        mtime = s.getattr(d.ino).mtime_ns
        s.rename(d.ino, b"b.pt", d.ino, b"a.pt")
        assert s.read_file("/run/a.pt") == b"B" * 100
        assert s.getattr(d.ino).mtime_ns >= mtime
        s.mkdir(ROOT_INO, b"other")
        s.rename(ROOT_INO, b"run", s.resolve("/other").ino, b"run")
        assert s.read_file("/other/run/a.pt") == b"B" * 100
        with pytest.raises(Exception) as ei:
            s.rename(ROOT_INO, b"other", s.resolve("/other/run").ino, b"x")
        assert getattr(ei.value, "errno", None) == errno.EINVAL
        s.setattr(f.ino if False else s.resolve("/other/run/a.pt").ino, mode=0o640, mtime_ns=123)
        a = s.resolve("/other/run/a.pt")
        assert a.mode & 0o777 == 0o640 and a.mtime_ns == 123
        with pytest.raises(NotFound):
            s.resolve("/run")


def test_history_and_snapshots_read_old_trees(path):
    with Store.open(path) as s:
        s.mkdir(ROOT_INO, b"ck")
        s.write_file("/ck/model.pt", data(300_000, 1))
        snap1 = s.snapshot_create("step-1")
        s.write_file("/ck/model.pt", data(300_000, 2))
        s.unlink(s.resolve("/ck").ino, b"model.pt")
        with pytest.raises(NotFound):
            s.read_file("/ck/model.pt")
        assert s.read_file("/ck/model.pt", snap1.gen) == data(300_000, 1)
        with pytest.raises(Exists):
            s.snapshot_create("step-1")
        with pytest.raises(Exception):
            s.snapshot_create("a/b")
        hist = s.history(s.resolve("/ck/model.pt", snap1.gen).ino)
        assert [v.size for v in hist] == [300_000, 300_000]
        assert [v.vid for v in s.history("/ck/model.pt")] == [v.vid for v in hist]
        assert hist[0].added_bytes == 300_000 and hist[0].death_gen is not None
        # history not in any snapshot goes at expiry; the snapshot keeps its version
        s.expire_history()
        assert s.read_file("/ck/model.pt", snap1.gen) == data(300_000, 1)
        s.gc()
        assert s.read_file("/ck/model.pt", snap1.gen) == data(300_000, 1)
        s.snapshot_delete("step-1")
        s.expire_history()
        report = s.gc()
        assert report.chunks_deleted >= 1
        assert s.stats()["stored_bytes"] == 0


def test_expiry_keeps_the_history_of_an_inode_the_kernel_still_knows(tmp_path):
    """A file renamed over while the kernel still has its inode (a path looked up, not yet
    opened): expiry keeps its versions until the kernel forgets it, then drops them."""
    p = new_store(tmp_path / "store")
    with Store.open(p) as s:
        s.write_file("/w.bin", data(100_000, 1))
        s.write_file("/tmp.bin", data(100_000, 2))
        old = s.holds.looked_up(lambda: s.lookup(ROOT_INO, b"w.bin"))
        s.holds.refer_inode(old.ino)  # two lookups of it: FORGET may drop them one at a time
        s.rename(ROOT_INO, b"tmp.bin", ROOT_INO, b"w.bin")
        s.expire_history()
        assert s.history(old.ino)[0].death_gen is not None
        assert s.read_file("/w.bin") == data(100_000, 2)
        s.holds.forget_inodes([(old.ino, 1)])
        s.expire_history()
        assert s.history(old.ino)
        s.gc()
        s.holds.forget_inodes([(old.ino, 1), (12345, 3)])  # an inode never counted: ignored
        assert s.holds.known_inodes() == set()
        assert s.expire_history() > 0
        assert s.history(old.ino) == []
        s.gc()
        assert s.read_file("/w.bin") == data(100_000, 2)
    assert_clean(p)


def test_dedup_across_files_and_versions(path):
    with Store.open(path) as s:
        blob = data(2 << 20, 5)
        s.write_file("/a", blob)
        stored = s.stats()["stored_bytes"]
        s.mkdir(ROOT_INO, b"ckpt-2")
        s.write_file("/ckpt-2/a", blob)
        s.write_file("/b", blob[:1_000_000] + b"new" + blob[1_000_000:])
        st = s.stats()
        assert st["logical_bytes"] == 3 * len(blob) + 3
        assert st["stored_bytes"] - stored < 600_000  # only chunks around the insertion are new


def test_session_random_writes_truncate_and_read_your_writes(path):
    with Store.open(path) as s:
        base = bytearray(data(1_500_000, 7))
        f = s.write_file("/f", bytes(base))
        with s.open_session(f.ino) as w:
            for off, n, seed in ((10, 5000, 1), (700_000, 100, 2), (1_499_990, 50_000, 3), (2_000_000, 10, 4)):
                chunk = data(n, seed)
                w.write(off, chunk)
                if off > len(base):
                    base.extend(bytes(off - len(base)))
                base[off:off + n] = chunk
            assert w.read(0, 3_000_000) == bytes(base)
            assert s.read_file("/f") != bytes(base)  # not visible before commit
            w.truncate(1_200_000)
            del base[1_200_000:]
            w.truncate(1_300_000)
            base.extend(bytes(100_000))
            assert w.read(0, 3_000_000) == bytes(base)
            attr = w.commit()
            assert attr.size == len(base)
        assert s.read_file("/f") == bytes(base)
        # abort drops everything uncommitted
        with s.open_session(f.ino) as w:
            w.write(0, b"zzz")
        assert s.read_file("/f") == bytes(base)
        s.setattr(f.ino, size=10)
        assert s.read_file("/f") == bytes(base[:10])


def test_sequential_fast_path_over_existing_file(path):
    with Store.open(path) as s:
        old = data(20 << 20, 8)
        f = s.write_file("/big", old)
        new = data(12 << 20, 9)
        with s.open_session(f.ino) as w:  # overwrite from 0 without truncating: the tail stays
            for i in range(0, len(new), 1 << 20):
                w.write(i, new[i:i + (1 << 20)])
            w.commit()
        assert s.read_file("/big") == new + old[len(new):]


def test_crash_before_commit_keeps_previous_version(path):
    s = Store.open(path)
    s.write_file("/m.pt", data(400_000, 1))
    f = s.resolve("/m.pt")
    w = s.open_session(f.ino)
    w.truncate(0)
    w.write(0, data(5_000_000, 2))
    w._materialize()  # records appended, never committed
    s.log.sync()
    # simulate kill -9: drop the process state without closing anything
    s.catalog.close()
    os.close(s._lock_fd)
    for seg in s.log._open.values():
        seg.close()
    with Store.open(path) as s2:
        assert s2.read_file("/m.pt") == data(400_000, 1)
        assert s2.recovered_bytes > 0 or s2.fsck().unreferenced_bytes > 0
        s2.gc()
        assert s2.fsck().unreferenced_bytes == 0


def test_crash_between_sync_and_catalog_commit(path, monkeypatch):
    s = Store.open(path)
    s.write_file("/m.pt", data(100_000, 1))
    f = s.resolve("/m.pt")

    def boom(fn, op, durable=True):
        raise KeyboardInterrupt("killed")

    w = s.open_session(f.ino)
    w.write(0, data(300_000, 2))
    monkeypatch.setattr(s.catalog, "write", boom)
    with pytest.raises(KeyboardInterrupt):
        w.commit()
    monkeypatch.undo()
    s.catalog.close()
    os.close(s._lock_fd)
    with Store.open(path) as s2:
        assert s2.read_file("/m.pt") == data(100_000, 1)


def test_create_filled_makes_the_file_with_its_first_version_or_nothing(path):
    """Store.create_filled: the file and its first version in one transaction (a copy-up's
    create). A failed fill, a name taken meanwhile, and a kill between the data's sync and
    that transaction all leave no file; an empty fill makes an empty file."""
    with Store.open(path) as s:
        blob = data(3_000_000, 3)

        def fill(session):  # type: ignore[no-untyped-def]
            for off in range(0, len(blob), 1 << 20):
                session.write(off, blob[off:off + (1 << 20)])

        attr = s.create_filled(ROOT_INO, b"a.bin", fill, 0o640, 7, 8)
        assert (attr.size, stat.S_IMODE(attr.mode), attr.uid, attr.gid) == (len(blob), 0o640, 7, 8)
        assert s.read_file("/a.bin") == blob and len(s.history("/a.bin")) == 1  # never an empty version
        with pytest.raises(Exists):
            s.create_filled(ROOT_INO, b"a.bin", lambda session: session.write(0, b"other"))
        assert s.read_file("/a.bin") == blob

        def broken(session):  # type: ignore[no-untyped-def]
            session.write(0, data(500_000, 4))
            raise CorruptData("the source's bytes are damaged")

        with pytest.raises(CorruptData):
            s.create_filled(ROOT_INO, b"b.bin", broken)
        with pytest.raises(NotFound):
            s.resolve("/b.bin")
        assert s.create_filled(ROOT_INO, b"empty", lambda session: None).size == 0
        assert s.read_file("/empty") == b""
        s.gc()
        assert s.fsck().unreferenced_bytes == 0
    s = Store.open(path)

    def killed(fn, op, durable=True):  # type: ignore[no-untyped-def]
        raise KeyboardInterrupt("killed")

    s.catalog.write = killed  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        s.create_filled(ROOT_INO, b"c.bin", lambda session: session.write(0, data(800_000, 5)))
    s.catalog.close()  # kill -9: nothing else closed
    os.close(s._lock_fd)
    with Store.open(path) as s2:
        with pytest.raises(NotFound):
            s2.resolve("/c.bin")
        assert s2.read_file("/a.bin") == blob
    assert_clean(path)


def test_segment_rotation_and_reopen(path):
    blobs = {f"/f{i}": data(1_500_000, 20 + i) for i in range(8)}  # 12 MB over 4 MiB segments
    with Store.open(path) as s:
        for p, b in blobs.items():
            s.write_file(p, b)
    assert len(list((path / "segments").glob("*.seg"))) >= 3
    with Store.open(path) as s:
        for p, b in blobs.items():
            assert s.read_file(p) == b


def _damage_first_chunk(path, store):
    row = store.catalog.reader().execute("SELECT seg_id, offset FROM chunks ORDER BY cid LIMIT 1").fetchone()
    seg = segment_path(path, row[0])
    with open(seg, "r+b") as f:
        f.seek(row[1] + 64 + 10)
        b = f.read(1)
        f.seek(row[1] + 64 + 10)
        f.write(bytes([b[0] ^ 0xFF]))


@pytest.mark.damaged
def test_corrupt_chunk_fails_reads_fsck_names_it_and_repair(path):
    with Store.open(path) as s:
        s.write_file("/bad.pt", data(200_000, 1))
        s.write_file("/good.pt", data(200_000, 2))
        _damage_first_chunk(path, s)
    with Store.open(path) as s:
        with pytest.raises(CorruptData):
            s.read_file("/bad.pt")
        assert s.read_file("/good.pt") == data(200_000, 2)
        report = s.fsck()
        assert not report.clean
        assert any("/bad.pt" in p.paths for p in report.problems)
        repaired = s.fsck(repair=True)
        assert repaired.repaired
        assert s.fsck().clean
        assert s.read_file("/good.pt") == data(200_000, 2)
        # the damaged version is gone; the file is back at its newest intact version (empty at create)
        assert any("reverted" in line for line in repaired.repaired)
        assert s.read_file("/bad.pt") == b""


@pytest.mark.damaged
def test_missing_and_truncated_segment(path):
    with Store.open(path) as s:
        s.write_file("/a", data(3_000_000, 1))
        s.write_file("/b", data(3_000_000, 2))
        segs = sorted({r[0] for r in s.catalog.reader().execute("SELECT seg_id FROM chunks")})
        a_segs = {r[0] for r in s.catalog.reader().execute(
            "SELECT DISTINCT c.seg_id FROM chunks c JOIN extents e ON e.cid=c.cid JOIN versions v ON v.content_id=e.content_id"
            " WHERE v.ino=?", (s.resolve('/a').ino,))}
    last = segs[-1]
    assert last not in a_segs or len(segs) > 1
    p = segment_path(path, last)
    os.truncate(p, p.stat().st_size // 2)
    with Store.open(path) as s:
        with pytest.raises(CorruptData):
            s.read_file("/b")
        if last not in a_segs:
            assert s.read_file("/a") == data(3_000_000, 1)
        assert not s.fsck().clean
        s.fsck(repair=True)
        assert s.fsck().clean
    assert_clean(path)


def test_failed_commit_loses_nothing_and_can_be_retried(path, monkeypatch):
    with Store.open(path) as s:
        f = s.write_file("/f", data(300_000, 1))
        want = bytearray(data(300_000, 1))
        with s.open_session(f.ino) as w:
            w.write(1000, b"Z" * 5000)  # overlay (slow path)
            want[1000:6000] = b"Z" * 5000
            real = s.catalog.write
            calls = {"n": 0}

            def flaky(fn, op, durable=True):
                calls["n"] += 1
                if op == "commit" and calls["n"] == 1:
                    raise OSError(28, "No space left on device")
                return real(fn, op, durable)

            monkeypatch.setattr(s.catalog, "write", flaky)
            with pytest.raises(OSError):
                w.commit()
            s.gc()  # the session's chunks stay pinned across the failure
            assert w.read(0, 400_000) == bytes(want)
            w.commit()
            monkeypatch.undo()
        assert s.read_file("/f") == bytes(want)


def test_session_keeps_reading_after_unlink_expire_gc(path):
    with Store.open(path) as s:
        f = s.write_file("/f", data(400_000, 1))
        with s.open_session(f.ino) as w:
            w.write(0, data(400_000, 2))
            w.commit()
            s.unlink(ROOT_INO, b"f")
            s.expire_history()
            s.gc()
            assert w.read(0, 400_000) == data(400_000, 2)
            w.write(10, b"late")
            assert w.commit() is None  # the file is gone: nothing to commit to
            s.gc()
            assert w.read(0, 20) == data(400_000, 2)[:10] + b"late" + data(400_000, 2)[14:20]


def test_abort_returns_session_to_committed_version(path):
    with Store.open(path) as s:
        f = s.write_file("/f", data(100_000, 1))
        with s.open_session(f.ino) as w:
            w.write(50, b"discard me")
            w.abort()
            assert w.read(0, 100_000) == data(100_000, 1)
            assert w.commit() is None  # nothing left to commit
        assert s.read_file("/f") == data(100_000, 1)


def test_reader_survives_delete_and_gc(path):
    with Store.open(path) as s:
        f = s.write_file("/f", data(500_000, 3))
        with s.open_reader(f.ino) as r:
            s.unlink(ROOT_INO, b"f")
            s.expire_history()
            s.gc()
            assert r.read(0, 500_000) == data(500_000, 3)
        s.gc()
        assert s.stats()["stored_bytes"] == 0


def test_history_of_a_path_follows_renames_over_it(path):
    with Store.open(path) as s:
        for i in range(3):  # the safetensors / torch.distributed.checkpoint pattern
            tmp = s.create(ROOT_INO, b"model.tmp")
            with s.open_session(tmp.ino) as w:
                w.write(0, data(100_000, i))
                w.commit()
            s.rename(ROOT_INO, b"model.tmp", ROOT_INO, b"model.safetensors")
        hist = s.history("/model.safetensors")
        assert [v.size for v in hist] == [100_000] * 3
        assert hist[0].death_gen is None and all(v.death_gen is not None for v in hist[1:])


def test_metadata_changes_do_not_count_as_logical_bytes(path):
    with Store.open(path) as s:
        a = s.write_file("/f", data(1 << 20, 1))
        s.setattr(a.ino, mode=0o600)
        s.setattr(a.ino, mtime_ns=123)
        st = s.stats()
        assert st["logical_bytes"] == 1 << 20 and st["versions"] == 1 and st["dedup_ratio"] == 1.0


def test_session_mtime_goes_into_the_committed_version(path):
    with Store.open(path) as s:
        f = s.write_file("/f", b"x")
        gen = s.generation
        with s.open_session(f.ino) as w:
            w.write(0, b"yy")
            w.mtime_ns = 1_234_000_000_000
            attr = w.commit()
        assert attr.mtime_ns == 1_234_000_000_000 and s.generation == gen + 1


def test_sessions_readers_and_gc_in_threads_do_not_deadlock(path):
    import threading

    with Store.open(path) as s:
        f = s.write_file("/f", data(200_000, 1))
        stop = time_limit = __import__("time").monotonic() + 3
        errors: list[BaseException] = []

        def loop(fn):
            try:
                while __import__("time").monotonic() < stop:
                    fn()
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        def session_cycle():
            try:
                s.open_session(f.ino).close()
            except Busy:
                pass

        threads = [threading.Thread(target=loop, args=(fn,)) for fn in
                   (session_cycle, lambda: s.open_reader(f.ino).close(), s.gc)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert not any(t.is_alive() for t in threads), "deadlock"
        assert not errors and time_limit


def test_rename_over_a_file_before_close_keeps_the_previous_version_visible(path):
    """safetensors 0.8: create tmp, write, rename tmp over the target, then close."""
    with Store.open(path) as s:
        s.write_file("/model.safetensors", data(300_000, 1))
        tmp = s.create(ROOT_INO, b".tmpABC")
        with s.open_session(tmp.ino) as w:
            w.write(0, data(300_000, 2))
            s.rename(ROOT_INO, b".tmpABC", ROOT_INO, b"model.safetensors")
            assert s.read_file("/model.safetensors") == data(300_000, 1)  # not empty: the previous version
            w.commit()
        assert s.read_file("/model.safetensors") == data(300_000, 2)
        hist = s.history("/model.safetensors")
        assert [v.size for v in hist][:2] == [300_000, 300_000]


def test_gc_keeps_chunks_an_uncommitted_session_found_by_dedup(path):
    """A session that dedups against stored chunks pins them: expiry + gc before its commit
    must not delete them (the chunks are unreferenced at that moment, but not dead)."""
    body = data(20 << 20, 7)  # over one 8 MiB batch: chunks are looked up and pinned while writing
    with Store.open(path) as s:
        s.write_file("/a", body)
        s.write_file("/a", b"other")  # body's version is history now, held by no snapshot
        b = s.create(ROOT_INO, b"b")
        with s.open_session(b.ino) as w:
            w.write(0, body)
            with w._lock:
                w._wait()  # the batch has run: its chunks were found in the catalog and pinned
            assert s.expire_history(0) > 0
            s.gc()
            w.commit()
        assert s.read_file("/b") == body


def test_the_catalog_reserve_follows_the_catalog_within_its_bounds():
    from cowfs.store.catalog.db import RESERVE_MAX, RESERVE_MIN, reserve_size

    tb = 1 << 40
    assert reserve_size(100 << 10, tb) == RESERVE_MIN  # a new store keeps 1 MiB, not 1% of the device
    assert reserve_size(10 << 20, tb) == 20 << 20  # twice the catalog
    assert reserve_size(1 << 30, tb) == RESERVE_MAX
    assert reserve_size(10 << 20, 500 << 20) == 5 << 20  # at most 1% of a small device...
    assert reserve_size(10 << 20, 20 << 20) == RESERVE_MIN  # ...but never under 1 MiB


def test_a_new_store_reserves_one_mib_for_its_catalog(path):
    with Store.open(path):
        reserve = os.path.join(path, "catalog.db.reserve")
        assert os.stat(reserve).st_blocks * 512 == 1 << 20


def test_the_pools_have_one_worker_per_cpu_unless_told(store_path):
    """The per-byte pools (chunking and appending; reading ahead and verifying) are sized to
    the machine, or to `workers` (cowfs mount --workers N)."""
    with Store.open(store_path) as s:
        assert s.executor._max_workers == s.readahead._max_workers == (os.cpu_count() or 2)
    with Store.open(store_path, workers=5) as s:
        assert s.executor._max_workers == s.readahead._max_workers == 5


def test_directory_link_counts_follow_every_change_and_fsck_checks_them(path):
    with Store.open(path) as s:
        a = s.mkdir(ROOT_INO, b"a")
        b = s.mkdir(ROOT_INO, b"b")
        s.mkdir(a.ino, b"x")
        s.mkdir(b.ino, b"y")
        s.create(a.ino, b"f")  # files do not count
        snap = s.snapshot_create("before").gen
        assert [s.getattr(i).nlink for i in (ROOT_INO, a.ino, b.ino)] == [4, 3, 3]
        s.rename(a.ino, b"x", b.ino, b"x")  # a directory moves: one parent loses it, the other gains it
        assert [s.getattr(i).nlink for i in (a.ino, b.ino)] == [2, 4]
        s.rename(b.ino, b"x", b.ino, b"y")  # over an empty directory in the same parent
        assert s.getattr(b.ino).nlink == 3
        s.mkdir(a.ino, b"z")
        s.rename(b.ino, b"y", a.ino, b"z")  # over an empty directory in another parent
        assert [s.getattr(i).nlink for i in (a.ino, b.ino)] == [3, 2]
        s.rmdir(a.ino, b"z")
        assert s.getattr(a.ino).nlink == 2
        # the snapshot keeps the counts of its generation
        assert [s.getattr(i, snap).nlink for i in (ROOT_INO, a.ino, b.ino)] == [4, 3, 3]
        assert s.fsck().clean
    conn = sqlite3.connect(path / CATALOG_FILE)
    conn.execute("UPDATE versions SET nlink = 7 WHERE ino = ? AND death_gen = ?", (a.ino, LIVE))
    conn.commit()
    conn.close()
    with Store.open(path) as s:
        report = s.fsck()
        assert [p.line() for p in report.problems if "link count" in p.line()], report.problems
        assert any("link count set to 2" in line for line in s.fsck(repair=True).repaired)
        assert s.getattr(a.ino).nlink == 2 and s.fsck().clean


def test_a_created_file_gets_its_session_without_a_catalog_read(path):
    """The FUSE create path: create_submit (not waited on by the caller's thread), then
    open_created_session on the empty version it returned; the session's commit makes the
    file's first version durable, and a file that is not just created is refused."""
    with Store.open(path) as s:
        created = s.create_submit(ROOT_INO, b"new.bin", 0o640, os.getuid(), os.getgid())
        attr = s.catalog.outcome(created)
        assert attr.size == 0 and attr.content_id is None and stat.S_IMODE(attr.mode) == 0o640
        session = s.open_created_session(attr)
        with pytest.raises(Busy):
            s.open_created_session(attr)
        session.write(0, data(300_000, 3))
        assert session.commit().size == 300_000
        session.close()
        again = s.create_submit(ROOT_INO, b"new.bin", 0o640, os.getuid(), os.getgid())
        with pytest.raises(Exists):
            s.catalog.outcome(again)
        with pytest.raises(InvalidArgument):  # it has a body now
            s.open_created_session(s.getattr(attr.ino))
    with Store.open(path) as s:
        assert s.read_file("/new.bin") == data(300_000, 3)


def test_commit_names_each_extent_with_its_own_chunk_row(path):
    """A commit's extents reference the chunk rows of their own hashes whether every chunk was
    new (cids taken from the insert: commit._new_cids), some were stored already (looked up:
    commit._stored_cids), or the file repeats a chunk within itself."""
    import sqlite3 as sq

    from cowfs.store.data import commit

    blob = data(3 << 20, 11)
    taken = {"new": 0, "stored": 0}
    new_cids, stored_cids = commit._new_cids, commit._stored_cids

    def counting_new(*a):
        got = new_cids(*a)
        taken["new"] += got is not None
        return got

    def counting_stored(*a):
        taken["stored"] += 1
        return stored_cids(*a)

    commit._new_cids, commit._stored_cids = counting_new, counting_stored
    try:
        with Store.open(path) as s:
            s.write_file("/all-new", blob)
            assert taken == {"new": 1, "stored": 0}
            s.write_file("/half-old", blob[: 1 << 20] + data(2 << 20, 12) + b"x")
            s.write_file("/twice", data(1 << 20, 13) * 2 + b"tail")
            assert taken["stored"] >= 1
            files = {name: s.read_file(name) for name in ("/all-new", "/half-old", "/twice")}
    finally:
        commit._new_cids, commit._stored_cids = new_cids, stored_cids
    assert files["/all-new"] == blob and files["/twice"] == data(1 << 20, 13) * 2 + b"tail"
    db = sq.connect(f"file:{path / CATALOG_FILE}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT e.content_id, e.file_offset, e.length, c.hash FROM extents e JOIN chunks c ON "
                          "c.cid = e.cid ORDER BY e.content_id, e.file_offset").fetchall()
    finally:
        db.close()
    from blake3 import blake3

    bodies: dict[int, list[tuple[int, int, bytes]]] = {}
    for content, off, length, h in rows:
        bodies.setdefault(content, []).append((off, length, bytes(h)))
    by_size = {len(b): b for b in files.values()}
    checked = 0
    for extents in bodies.values():
        size = extents[-1][0] + extents[-1][1]
        body = by_size.get(size)
        if body is None:
            continue
        for off, length, h in extents:
            assert blake3(body[off:off + length]).digest() == h
            checked += 1
    assert checked > 100


def test_the_stores_threads_carry_their_pools_names_for_the_os(path):
    """Per-thread CPU in /proc says which pool used it (the scaling benchmark reads it)."""
    import threading

    def comm() -> str:
        return open(f"/proc/self/task/{threading.get_native_id()}/comm").read().strip()

    with Store.open(path) as s:
        assert s.executor.submit(comm).result() == "cowfs-chunk"
        assert s.readahead.submit(comm).result() == "cowfs-readahead"
        names = {open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")}
        assert "cowfs-catalog" in names
