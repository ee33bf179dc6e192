"""A node's own mount of the job's namespace (docs/design.md section 17, "A node's own mount
of the namespace"): `cowfs mount STORE MNT --all-stores` shows the other stores' files beside
the store's own, follows their new versions, lets the node write its own files anywhere (a
directory only the others have is made in the store first), cannot remove or move the others'
files, and where both hold a path shows the later change, as consumers do."""
from __future__ import annotations

import errno
import json
import os
import queue
import time
from pathlib import Path

import pytest

from cowfs.plugins.get import is_memfd, open_read
from cowfs.remote.config import RemoteConfig
from cowfs.remote.s3 import Bucket
from tests.support.consumerutil import Watch, has_bytes, wait_for
from tests.support.mountutil import cowfs, kill9, mounted
from tests.support.storeutil import assert_clean, data, new_store

MIB = 1 << 20


pytestmark = pytest.mark.usefixtures("aws_env")  # the engine's keys in AWS_* (conftest.py)


def generation(mnt: Path) -> int:
    return int(json.loads(cowfs("stats", str(mnt), "--json").stdout)["generations"])


def names(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir())


def two_nodes(tmp_path: Path, rgw, s3_bucket) -> tuple[str, list[Path]]:  # type: ignore[no-untyped-def]
    """Two stores whose remote is one job's prefix (with notices), both in the bucket before
    either mounts; the prefix's URL and the stores."""
    url = f"s3://{s3_bucket.name}/job"
    stores = [new_store(tmp_path / f"node{i}", segment_size=16 << 20) for i in range(2)]
    for p in stores:
        cowfs("remote", "set", str(p), url, "--endpoint", rgw.credentials.endpoint, "--notify", "127.0.0.1:0")
        cowfs("remote", "push", str(p))
    return url, stores


@pytest.mark.long
def test_each_node_reads_the_others_files_and_writes_its_own(tmp_path, rgw, s3_bucket):
    _, stores = two_nodes(tmp_path, rgw, s3_bucket)
    with mounted(stores[0], tmp_path / "n0", "--all-stores") as n0, \
            mounted(stores[1], tmp_path / "n1", "--all-stores") as n1:
        step = Path("run1") / "step-1"
        for rank, node in enumerate((n0, n1)):
            (node / step).mkdir(parents=True)
            (node / step / f"__{rank}_0.distcp").write_bytes(data(MIB, rank))
        for node in (n0, n1):  # every rank's file on every node, whichever wrote it
            for rank in range(2):
                wait_for(f"rank {rank}'s file on {node.name}",
                         lambda node=node, rank=rank: has_bytes(node / step / f"__{rank}_0.distcp", data(MIB, rank)))
            assert names(node / step) == ["__0_0.distcp", "__1_0.distcp"]
        # a new version of the other node's file shows, with its extended attributes
        os.setxattr(n0 / step / "__0_0.distcp", "user.rank", b"0")
        (n0 / step / "__0_0.distcp").write_bytes(data(MIB, 7))
        wait_for("n0's new version on n1", lambda: has_bytes(n1 / step / "__0_0.distcp", data(MIB, 7)))
        assert os.getxattr(n1 / step / "__0_0.distcp", "user.rank") == b"0"
        assert os.listxattr(n1 / step / "__1_0.distcp") == []
        with open_read(n1 / step / "__0_0.distcp") as f:  # through the bulk socket: a memfd of its bytes
            assert is_memfd(f.fileno()) and f.read() == data(MIB, 7)
        # the other node's files cannot be removed or moved here
        for change in (lambda: (n1 / step / "__0_0.distcp").unlink(),
                       lambda: (n1 / step / "__0_0.distcp").rename(n1 / step / "moved")):
            with pytest.raises(OSError) as e:
                change()
            assert e.value.errno == errno.EROFS
        # a directory only the other node has: this node's file goes into its own copy of it
        (n1 / "run1" / "step-2").mkdir()
        (n1 / "run1" / "step-2" / "__1_0.distcp").write_bytes(data(MIB, 12))
        wait_for("n1's step-2 on n0", lambda: (n0 / "run1" / "step-2" / "__1_0.distcp").exists())
        (n0 / "run1" / "step-2" / "__0_0.distcp").write_bytes(data(MIB, 2))
        assert b"step-2" in cowfs("ls", str(n0), "/run1").stdout  # in the store itself
        wait_for("n0's step-2 file on n1", lambda: has_bytes(n1 / "run1" / "step-2" / "__0_0.distcp", data(MIB, 2)))
        assert names(n0 / "run1" / "step-2") == names(n1 / "run1" / "step-2") == ["__0_0.distcp", "__1_0.distcp"]
        # both hold one path: the later write shows on both nodes (the clash rule, by the
        # stores' Lamport clocks); once it goes, the other's shows again
        latest = Path("run1") / "latest"
        (n0 / latest).write_text("from n0")
        wait_for("n0's latest on n1", lambda: has_bytes(n1 / latest, b"from n0"))
        wait_for("n1's clock past n0's write", lambda g=generation(n0): generation(n1) >= g)
        (n1 / latest).write_text("from n1")  # written over n0's file: n1's own copy, later
        assert (n1 / latest).read_text() == "from n1"
        wait_for("the later write on n0 too", lambda: has_bytes(n0 / latest, b"from n1"))
        with pytest.raises(OSError) as e:  # shown there is n1's, over n0's own: not n0's to remove
            (n0 / latest).unlink()
        assert e.value.errno == errno.EROFS
        wait_for("n0's clock past n1's write", lambda g=generation(n1): generation(n0) >= g)
        (n0 / latest).write_text("from n0 again")
        assert (n0 / latest).read_text() == "from n0 again"
        wait_for("n0's later write on n1", lambda: has_bytes(n1 / latest, b"from n0 again"))
        (n0 / latest).unlink()
        wait_for("n1's again on n0", lambda: has_bytes(n0 / latest, b"from n1"))
        wait_for("n1's own on n1", lambda: has_bytes(n1 / latest, b"from n1"))
        with pytest.raises(OSError) as e:  # only n1 holds it now
            (n0 / latest).unlink()
        assert e.value.errno == errno.EROFS
        # written in place over the other node's file: a copy of it, changed, is this node's own
        with open(n1 / step / "__0_0.distcp", "r+b") as f:
            f.write(b"n1")
        expect = b"n1" + data(MIB, 7)[2:]
        assert (n1 / step / "__0_0.distcp").read_bytes() == expect
        assert cowfs("cat", str(n1), f"/{step}/__0_0.distcp").stdout == expect  # in the store itself
        wait_for("n1's later copy on n0 too", lambda: has_bytes(n0 / step / "__0_0.distcp", expect))
        assert cowfs("cat", str(n0), f"/{step}/__0_0.distcp").stdout == data(MIB, 7)  # n0's own, shadowed
    for p in stores:
        assert_clean(p)


def test_a_nodes_watch_reports_the_other_nodes_changes_too(tmp_path, rgw, s3_bucket):
    _, stores = two_nodes(tmp_path, rgw, s3_bucket)
    with mounted(stores[0], tmp_path / "n0", "--all-stores") as n0, \
            mounted(stores[1], tmp_path / "n1", "--all-stores") as n1, Watch(n0) as events:
        (n0 / "mine.bin").write_bytes(data(MIB, 1))  # the store's own change, as before
        (n1 / "step-1").mkdir()
        (n1 / "step-1" / "__1_0.distcp").write_bytes(data(MIB, 2))  # the other node's

        def seen(kind: str, path: str) -> None:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    e = events.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if (e["kind"], e.get("path")) == (kind, path):
                    return
            raise AssertionError(f"n0's watch never reported {kind} {path}")

        seen("version", "/mine.bin")
        seen("version", "/step-1/__1_0.distcp")
        assert has_bytes(n0 / "step-1" / "__1_0.distcp", data(MIB, 2))
        (n1 / "step-1" / "__1_0.distcp").unlink()
        seen("remove", "/step-1/__1_0.distcp")
    for p in stores:
        assert_clean(p)


def test_a_write_over_the_other_nodes_file_cut_short_by_a_crash_leaves_what_showed(tmp_path, rgw, s3_bucket):
    """Killed while a handle writes over the other node's file (no O_TRUNC): the node's own
    copy, committed at the open, shows the other's bytes, never an empty file."""
    _, stores = two_nodes(tmp_path, rgw, s3_bucket)
    with mounted(stores[1], tmp_path / "n1", "--all-stores") as n1:
        (n1 / "f.bin").write_bytes(data(MIB, 3))
        with mounted(stores[0], tmp_path / "n0", "--all-stores") as n0:
            wait_for("n1's file on n0", lambda: has_bytes(n0 / "f.bin", data(MIB, 3)))
            fd = os.open(n0 / "f.bin", os.O_WRONLY)
            try:
                os.pwrite(fd, b"half a write", 100)
                kill9(stores[0], n0)
            finally:
                try:
                    os.close(fd)
                except OSError:  # the daemon is gone
                    pass
        assert cowfs("cat", str(stores[0]), "/f.bin").stdout == data(MIB, 3)  # the store's own copy
        with mounted(stores[0], tmp_path / "n0", "--all-stores") as n0:
            assert (n0 / "f.bin").read_bytes() == data(MIB, 3)
    for p in stores:
        assert_clean(p)


def test_a_write_over_whose_copy_fails_changes_nothing(tmp_path, rgw, s3_bucket):
    """The other node's bytes are damaged in the bucket: an open for writing over its file
    (no O_TRUNC) fails with EIO and leaves no file, no handle and no copy behind; once the
    other node writes the file again, the same open works."""
    url, stores = two_nodes(tmp_path, rgw, s3_bucket)
    with mounted(stores[0], tmp_path / "n0", "--all-stores") as n0, \
            mounted(stores[1], tmp_path / "n1", "--all-stores") as n1:
        (n1 / "f.bin").write_bytes(data(MIB, 5))
        wait_for("n1's file on n0", lambda: (n0 / "f.bin").exists())  # named, none of its bytes read
        bucket = Bucket(RemoteConfig(url, endpoint=rgw.credentials.endpoint))
        for obj in bucket.list(bucket.key("packs", "")):
            bucket.put(obj.key, bytes(obj.size))  # every pack zeroed: the copy-up's reads fail their checks
        for _ in range(2):  # the second open finds no handle or session left by the first
            with pytest.raises(OSError) as e:
                os.open(n0 / "f.bin", os.O_WRONLY)
            assert e.value.errno == errno.EIO
            assert b"f.bin" not in cowfs("ls", str(n0), "/").stdout  # no file of n0's own
        (n1 / "f.bin").write_bytes(data(MIB, 6))
        wait_for("n1's new version on n0", lambda: has_bytes(n0 / "f.bin", data(MIB, 6)))
        with open(n0 / "f.bin", "r+b") as f:
            f.write(b"n0")
        assert cowfs("cat", str(n0), "/f.bin").stdout == b"n0" + data(MIB, 6)[2:]
    for p in stores:
        assert_clean(p)


def test_all_stores_on_a_store_without_a_remote_is_refused(tmp_path):
    store = new_store(tmp_path / "s")
    (tmp_path / "m").mkdir()
    r = cowfs("mount", str(store), str(tmp_path / "m"), "--all-stores", check=False)
    assert r.returncode != 0 and "no remote" in r.stderr.decode() and r.stderr.decode().count("\n") == 1
    assert_clean(store)
