"""A producer and a consumer on one machine, as two daemons with separate stores and caches:
the consumer's read-only mount of the bucket follows the producer's new versions by pushed
notices, serves the bytes from the packs, shows snapshots, refuses writes, works with
`cowfs watch`, and catches up after being killed."""
from __future__ import annotations

import errno
import json
import os
import zlib
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from cowfs.fs.mount import READ_AHEAD_KIB
from cowfs.remote.catalogs import retained_catalogs
from cowfs.remote.config import read_remote_config
from cowfs.remote.s3 import Bucket
from cowfs.store.log.layout import read_config
from tests.support.consumerutil import Consumer, Watch, drain, has_bytes, subscribed, wait_for
from tests.support.mountutil import cowfs, kill9, mounted, read_ahead_kib, store_path  # noqa: F401 (a fixture)
from tests.support.storeutil import data


pytestmark = pytest.mark.usefixtures("aws_env")  # the engine's keys in AWS_* (conftest.py)


def test_consumer_follows_the_producer(store_path, tmp_path, rgw, s3_bucket):
    url = f"s3://{s3_bucket.name}/prod"
    cowfs("remote", "set", str(store_path), url, "--endpoint", rgw.credentials.endpoint, "--notify", "127.0.0.1:0")
    with mounted(store_path, tmp_path / "prod") as prod:
        (prod / "run").mkdir()
        (prod / "run" / "model.bin").write_bytes(data(3 << 20, 1))
        wait_for("first upload", lambda: json.loads(cowfs("remote", "status", str(prod), "--json").stdout)
                 ["catalog_generation"] > 0)
        with Consumer(url, rgw.credentials.endpoint, tmp_path / "cons", tmp_path / "cache") as cons:
            wait_for("the first version", lambda: has_bytes(cons / "run" / "model.bin", data(3 << 20, 1)))
            # the kernel reads ahead as on a producer's mount: READs of 1 MiB, not 128 KiB
            wait_for("the read-ahead raised", lambda: read_ahead_kib(cons) == READ_AHEAD_KIB)
            with Watch(cons) as seen:
                subscribed(prod, seen)
                # new versions appear without the consumer polling, and watch reports them
                for k in range(2, 5):
                    (prod / "run" / "model.bin").write_bytes(data(3 << 20, k))
                    wait_for(f"version {k}", lambda k=k: has_bytes(cons / "run" / "model.bin", data(3 << 20, k)))
                cowfs("snapshot", "create", str(prod), "step-4")
                wait_for("the snapshot", lambda: has_bytes(cons / ".snapshots" / "step-4" / "run" / "model.bin",
                                                          data(3 << 20, 4)))
                events = drain(seen, lambda e: e.get("kind") == "snapshot")
                assert any(e["kind"] == "version" and e["path"] == "/run/model.bin" for e in events)
            # the CLI reaches the consumer's daemon through its mountpoint
            assert b"model.bin" in cowfs("ls", str(cons), "/run").stdout
            assert cowfs("cat", str(cons), "/run/model.bin", "--snapshot", "step-4").stdout == data(3 << 20, 4)
            assert json.loads(cowfs("stats", str(cons), "--json").stdout)["files"] >= 1
            # read-only: the kernel refuses writes, the daemon refuses changes
            with pytest.raises(OSError) as e:
                (cons / "run" / "new.bin").write_bytes(b"x")
            assert e.value.errno == errno.EROFS
            r = cowfs("snapshot", "create", str(cons), "mine", check=False)
            assert r.returncode == 2 and "read-only" in r.stderr.decode()
            # a second consumer mount on the same cache is refused in one line
            r = cowfs("mount", url, str(tmp_path / "other"), "--cache", str(tmp_path / "cache"),
                      "--endpoint", rgw.credentials.endpoint, check=False)
            assert r.returncode == 2 and r.stderr.decode().count("\n") == 1


@contextmanager
def producer(store_path: Path, url: str, rgw, mnt: Path) -> Iterator[Path]:  # type: ignore[no-untyped-def]
    """The store mounted with a remote that sends notices, /a.bin written and uploaded."""
    cowfs("remote", "set", str(store_path), url, "--endpoint", rgw.credentials.endpoint, "--notify", "127.0.0.1:0")
    with mounted(store_path, mnt) as prod:
        (prod / "a.bin").write_bytes(data(1 << 20, 1))
        wait_for("first upload", lambda: json.loads(cowfs("remote", "status", str(prod), "--json").stdout)
                 ["catalog_generation"] > 0)
        yield prod


def test_a_killed_consumer_catches_up_when_it_comes_back(store_path, tmp_path, rgw, s3_bucket):
    url = f"s3://{s3_bucket.name}/prod"
    cache = tmp_path / "cache"
    with producer(store_path, url, rgw, tmp_path / "prod") as prod:
        with Consumer(url, rgw.credentials.endpoint, tmp_path / "cons", cache) as cons:
            wait_for("a.bin", lambda: has_bytes(cons / "a.bin", data(1 << 20, 1)))
            kill9(cache, cons)
        (prod / "a.bin").write_bytes(data(1 << 20, 2))
        (prod / "b.bin").write_bytes(data(1 << 20, 3))
        with Consumer(url, rgw.credentials.endpoint, tmp_path / "cons", cache) as cons:
            wait_for("caught up", lambda: has_bytes(cons / "a.bin", data(1 << 20, 2))
                     and has_bytes(cons / "b.bin", data(1 << 20, 3)))
    # the producer is gone: a consumer still mounts and serves the last uploaded generation
    with Consumer(url, rgw.credentials.endpoint, tmp_path / "cons", cache) as cons:
        assert (cons / "b.bin").read_bytes() == data(1 << 20, 3)


def catalog_objects(store: Path) -> list[str]:
    """The store's catalog objects in the bucket, by name."""
    cfg = read_remote_config(store)
    assert cfg is not None
    return [c.key.rsplit("/", 1)[-1] for c in retained_catalogs(Bucket(cfg), read_config(store).store_uuid)]


def test_a_consumer_follows_deltas_and_catches_up_through_a_whole_catalog(store_path, tmp_path, rgw, s3_bucket):
    """Each new version reaches the consumer as a delta applied to the catalog it holds; a
    consumer away while remote gc replaced the catalog objects it would have continued from
    starts again from the whole catalog and the deltas after it, in a new file; the file it
    held and what fetches cut short left in its cache are removed when it starts."""
    url = f"s3://{s3_bucket.name}/prod"
    cache = tmp_path / "cache"
    with producer(store_path, url, rgw, tmp_path / "prod") as prod:
        with Consumer(url, rgw.credentials.endpoint, tmp_path / "cons", cache) as cons:
            wait_for("a.bin", lambda: has_bytes(cons / "a.bin", data(1 << 20, 1)))
            for k in (2, 3):
                (prod / "a.bin").write_bytes(data(1 << 20, k))
                wait_for(f"version {k}", lambda k=k: has_bytes(cons / "a.bin", data(1 << 20, k)))
            names = catalog_objects(store_path)
            assert len([n for n in names if n.endswith(".db.zst")]) == 1 and len(names) >= 3, names
            kill9(cache, cons)
        (prod / "a.bin").write_bytes(data(1 << 20, 4))  # two generations while the consumer is away
        wait_for("version 4 uploaded", lambda: (lambda st: st["catalog_generation"] == st["generation"])(
            json.loads(cowfs("remote", "status", str(prod), "--json").stdout)))
        (prod / "c.bin").write_bytes(data(1 << 10, 6))
        # a whole catalog; the objects older than it are deleted, the delta from the consumer's generation too
        cowfs("remote", "gc", str(prod), "--grace", "2s")
        (prod / "b.bin").write_bytes(data(1 << 20, 5))
        wait_for("the delta after the whole catalog", lambda: any(
            n.endswith(".delta.zst") and int(n[:16]) > int(w[:16])
            for names in [catalog_objects(store_path)] for w in names if w.endswith(".db.zst") for n in names))
        names = catalog_objects(store_path)
        (whole,) = [n for n in names if n.endswith(".db.zst")]
        held = [f.name for f in cache.glob("catalog-*.db")]
        assert len(held) == 1, held
        # a fetch of that whole catalog cut short by a crash, and a delta's part
        uuid = read_config(store_path).store_uuid
        (cache / f"catalog-{uuid}-{whole[:16]}.db.tmp").write_bytes(b"cut short")
        (cache / f"{held[0]}.99.delta").write_bytes(b"cut short")
        with Consumer(url, rgw.credentials.endpoint, tmp_path / "cons", cache) as cons:
            wait_for("caught up", lambda: has_bytes(cons / "a.bin", data(1 << 20, 4))
                     and has_bytes(cons / "b.bin", data(1 << 20, 5)))
            # a new file from the whole catalog serves; the one held before and the leftovers went at start
            left = {f.name for f in cache.glob("catalog-*")}
            assert f"catalog-{uuid}-{whole[:16]}.db" in left, left
            assert not left & {held[0], f"{held[0]}.99.delta", f"catalog-{uuid}-{whole[:16]}.db.tmp"}, left


def test_a_producer_without_notices_is_followed_by_looks_at_the_bucket(store_path, tmp_path, rgw, s3_bucket):
    """A producer whose remote has no --notify: the consumer says once that it looks at the
    bucket instead, and follows its new versions so."""
    url = f"s3://{s3_bucket.name}/quiet"
    cowfs("remote", "set", str(store_path), url, "--endpoint", rgw.credentials.endpoint)

    def uploaded(prod: Path) -> int:
        return json.loads(cowfs("remote", "status", str(prod), "--json").stdout)["catalog_generation"]

    with mounted(store_path, tmp_path / "prod") as prod:
        (prod / "model.bin").write_bytes(data(1 << 20, 1))
        wait_for("first upload", lambda: uploaded(prod) > 0)
        cache = tmp_path / "cache"
        with Consumer(url, rgw.credentials.endpoint, tmp_path / "cons", cache) as cons:
            assert has_bytes(cons / "model.bin", data(1 << 20, 1))
            said = "sends no notices"
            wait_for("the consumer says it looks at the bucket", lambda: said in (cache / "cowfs.log").read_text())
            for k in (2, 3):
                (prod / "model.bin").write_bytes(data(1 << 20, k))
                wait_for(f"version {k}, by a look", lambda k=k: has_bytes(cons / "model.bin", data(1 << 20, k)))
        assert (cache / "cowfs.log").read_text().count(said) == 1


def test_remote_mount_errors_are_one_line(tmp_path, rgw, s3_bucket):
    (tmp_path / "m").mkdir()
    cases = [
        (("mount", f"s3://{s3_bucket.name}/nothing", str(tmp_path / "m"), "--endpoint", rgw.credentials.endpoint), "--cache"),
        (("mount", f"s3://{s3_bucket.name}/nothing", str(tmp_path / "m"), "--cache", str(tmp_path / "c"),
          "--endpoint", rgw.credentials.endpoint), "no store has uploaded"),
        (("mount", "s3://no-such-bucket-q/x", str(tmp_path / "m"), "--cache", str(tmp_path / "c"),
          "--endpoint", rgw.credentials.endpoint), "does not exist"),
        (("mount", f"s3://{s3_bucket.name}/x", str(tmp_path / "m"), "--cache", str(tmp_path / "c"),
          "--endpoint", "http://127.0.0.1:1"), "cannot reach"),
        (("mount", f"s3://{s3_bucket.name}/x", str(tmp_path / "m"), "--cache", str(tmp_path / "c"),
          "--auto-snapshot", "1m"), "not for a read-only remote mount"),
    ]
    for args, message in cases:
        r = cowfs(*args, check=False)
        err = r.stderr.decode()
        assert r.returncode == 2 and message in err and err.count("\n") == 1, (args, err)
    assert not os.listdir(tmp_path / "m")


def test_damaged_cache_is_fetched_again_and_a_missing_pack_gives_eio(store_path, tmp_path, rgw, s3_bucket):
    url = f"s3://{s3_bucket.name}/prod"
    cowfs("remote", "set", str(store_path), url, "--endpoint", rgw.credentials.endpoint)
    with mounted(store_path, tmp_path / "prod") as prod:
        (prod / "a.bin").write_bytes(data(6 << 20, 1))
        cowfs("remote", "push", str(prod))
    cache = tmp_path / "cache"
    with Consumer(url, rgw.credentials.endpoint, tmp_path / "cons", cache) as cons:
        assert (cons / "a.bin").read_bytes() == data(6 << 20, 1)
    blocks = sorted(cache.glob("blocks/*/*"))
    assert blocks
    for b in blocks:  # flip a byte in every cached block: each is fetched again
        raw = bytearray(b.read_bytes())
        raw[100] ^= 0xFF
        b.write_bytes(bytes(raw))
    with Consumer(url, rgw.credentials.endpoint, tmp_path / "cons", cache) as cons:
        assert (cons / "a.bin").read_bytes() == data(6 << 20, 1)
    assert all(zlib.crc32(b.read_bytes()[:-4]).to_bytes(4, "little") == b.read_bytes()[-4:]
               for b in cache.glob("blocks/*/*")), "the damaged blocks were fetched again"
    # the packs gone from the bucket and from the cache: EIO, never other bytes
    keys = [o["Key"] for o in s3_bucket.client.list_objects_v2(Bucket=s3_bucket.name)["Contents"]
            if "/packs/" in o["Key"]]
    s3_bucket.client.delete_objects(Bucket=s3_bucket.name, Delete={"Objects": [{"Key": k} for k in keys]})
    for b in cache.glob("blocks/*/*"):
        b.unlink()
    with Consumer(url, rgw.credentials.endpoint, tmp_path / "cons", cache) as cons:
        with pytest.raises(OSError) as e:
            (cons / "a.bin").read_bytes()
        assert e.value.errno == errno.EIO
