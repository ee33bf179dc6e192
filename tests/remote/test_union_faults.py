"""Faults under one namespace (docs/design.md section 17, "One namespace for a job"): a
producer killed in the middle of its uploads, a producer cut off from the engine (a network
namespace of its own, its link taken down), and the engine (radosgw) restarted while
producers upload and a consumer of every store follows. Nothing shows half: every file the
consumer shows holds the bytes one of its versions had; and once the producer is back, or
the engine answers again, everything converges."""
from __future__ import annotations

import json
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from cowfs.remote.config import read_remote_config
from cowfs.remote.s3 import Bucket
from tests.support.consumerutil import Consumer, has_bytes, wait_for
from tests.support.mountutil import cowfs, kill9, mounted, reaped
from tests.support.netns import IsolatedNet
from tests.support.storeutil import assert_clean, data, new_store


pytestmark = pytest.mark.usefixtures("aws_env")  # the engine's keys in AWS_* (conftest.py)


@pytest.fixture
def nodes(tmp_path, rgw, s3_bucket):
    url = f"s3://{s3_bucket.name}/job"
    paths = [new_store(tmp_path / f"node{i}", segment_size=16 << 20) for i in range(2)]
    for p in paths:
        cowfs("remote", "set", str(p), url, "--endpoint", rgw.credentials.endpoint, "--notify", "127.0.0.1:0")
    yield url, paths
    for p in paths:
        assert_clean(p)


def packs(store: Path) -> int:
    cfg = read_remote_config(store)
    assert cfg is not None
    b = Bucket(cfg)
    return sum(1 for _ in b.list(b.key("packs", "")))


def only_whole(cons: Path, versions: dict[str, set[bytes]]) -> bool:
    """Every file of `versions` the consumer shows holds one of its versions' bytes (a file
    is committed empty by its create, then whole at its close: never anything between)."""
    for name, allowed in versions.items():
        try:
            got = (cons / "job" / name).read_bytes()
        except FileNotFoundError:
            continue
        assert got in allowed, f"{name}: {len(got)} bytes, not one of its versions"
    return True


def test_a_producer_killed_mid_upload_shows_nothing_half_and_catches_up(nodes, tmp_path, rgw):
    url, (p0, p1) = nodes
    with Consumer(url, rgw.credentials.endpoint, tmp_path / "cons", tmp_path / "cache", "--all-stores") as cons:
        with mounted(p0, tmp_path / "n0") as n0:
            (n0 / "job").mkdir()
            (n0 / "job" / "a.bin").write_bytes(data(1 << 20, 0))
            wait_for("a.bin", lambda: has_bytes(cons / "job" / "a.bin", data(1 << 20, 0)))
            # a new file's versions: empty from its create, then its bytes from its close
            versions = {f"b{i}.bin": {b"", data(24 << 20, 10 + i)} for i in range(3)}
            with mounted(p1, tmp_path / "n1") as n1:
                before = packs(p1)
                (n1 / "job").mkdir()
                for i in range(3):
                    (n1 / "job" / f"b{i}.bin").write_bytes(data(24 << 20, 10 + i))
                wait_for("the upload under way", lambda: packs(p1) > before)
                kill9(p1, n1)  # its daemon dies in the middle of its passes
            assert only_whole(cons, versions)
            (n0 / "job" / "a.bin").write_bytes(data(1 << 20, 1))  # the other node goes on
            wait_for("a.bin's next version", lambda: has_bytes(cons / "job" / "a.bin", data(1 << 20, 1)))
            assert only_whole(cons, versions)
            with mounted(p1, tmp_path / "n1"):  # back: its next mount uploads what is left
                wait_for("every b file", lambda: all(has_bytes(cons / "job" / f"b{i}.bin", data(24 << 20, 10 + i))
                                                     for i in range(3)))


def test_the_engine_restarted_while_producers_upload(nodes, tmp_path, rgw):
    url, (p0, p1) = nodes
    with Consumer(url, rgw.credentials.endpoint, tmp_path / "cons", tmp_path / "cache", "--all-stores") as cons, \
            mounted(p0, tmp_path / "n0") as n0, mounted(p1, tmp_path / "n1") as n1:
        for i, node in enumerate((n0, n1)):
            (node / "job").mkdir()
            (node / "job" / f"r{i}.bin").write_bytes(data(2 << 20, i))
        for i in range(2):
            wait_for(f"r{i}", lambda i=i: has_bytes(cons / "job" / f"r{i}.bin", data(2 << 20, i)))
        versions = {f"r{i}.bin": {data(2 << 20, i), data(8 << 20, 20 + i)} for i in range(2)}
        for i, node in enumerate((n0, n1)):
            (node / "job" / f"r{i}.bin").write_bytes(data(8 << 20, 20 + i))
        rgw.restart_gateway()
        assert only_whole(cons, versions)
        for i, node in enumerate((n0, n1)):  # and after it, more: every producer and the consumer converge
            (node / "job" / f"s{i}.bin").write_bytes(data(1 << 20, 30 + i))
        for i in range(2):
            wait_for(f"r{i} after the restart", lambda i=i: has_bytes(cons / "job" / f"r{i}.bin", data(8 << 20, 20 + i)))
            wait_for(f"s{i}", lambda i=i: has_bytes(cons / "job" / f"s{i}.bin", data(1 << 20, 30 + i)))
        assert only_whole(cons, versions)
        for node in (n0, n1):
            status = json.loads(cowfs("remote", "status", str(node), "--json").stdout)
            assert status["catalog_generation"] >= 1


@contextmanager
def mounted_inside(net: IsolatedNet, store: Path, mnt: Path) -> Iterator[Path]:
    """`store` mounted by a daemon started inside `net` (its mount seen here)."""
    mnt.mkdir(exist_ok=True)
    subprocess.run(net.command(sys.executable, "-m", "cowfs.cli", "mount", str(store), str(mnt),
                               "--compact-idle", "off"), check=True, capture_output=True, timeout=120)
    with reaped(store, mnt):
        yield mnt


def test_a_producer_cut_off_from_the_engine(tmp_path, rgw, s3_bucket):
    """One producer in a network namespace of its own, cut off (its link down) while both
    producers write: the other's files go on showing, the cut one's new files show only
    once it is joined again, whole, and nothing shows half meanwhile."""
    url = f"s3://{s3_bucket.name}/job"
    endpoint = rgw.credentials.endpoint
    p0, p1 = (new_store(tmp_path / f"node{i}", segment_size=16 << 20) for i in range(2))
    with IsolatedNet(int(endpoint.rsplit(":", 1)[1])) as net:
        cowfs("remote", "set", str(p0), url, "--endpoint", endpoint, "--notify", "127.0.0.1:0")
        cowfs("remote", "set", str(p1), url, "--endpoint", net.endpoint, "--notify", f"{net.ns_ip}:0")
        with Consumer(url, endpoint, tmp_path / "cons", tmp_path / "cache", "--all-stores") as cons, \
                mounted(p0, tmp_path / "n0") as n0, mounted_inside(net, p1, tmp_path / "n1") as n1:
            for i, node in enumerate((n0, n1)):
                (node / "job").mkdir()
                (node / "job" / f"r{i}.bin").write_bytes(data(1 << 20, i))
            for i in range(2):
                wait_for(f"r{i}", lambda i=i: has_bytes(cons / "job" / f"r{i}.bin", data(1 << 20, i)))
            net.cut()
            try:
                (n1 / "job" / "cut.bin").write_bytes(data(4 << 20, 7))
                (n1 / "job" / "r1.bin").write_bytes(data(1 << 20, 8))
                (n0 / "job" / "r0.bin").write_bytes(data(1 << 20, 9))
                wait_for("the other node's new version", lambda: has_bytes(cons / "job" / "r0.bin", data(1 << 20, 9)))
                assert not (cons / "job" / "cut.bin").exists()
                assert (cons / "job" / "r1.bin").read_bytes() == data(1 << 20, 1)  # the version before the cut
            finally:
                net.join()
            wait_for("the cut node's files after it is joined again", lambda: has_bytes(
                cons / "job" / "cut.bin", data(4 << 20, 7)) and has_bytes(cons / "job" / "r1.bin", data(1 << 20, 8)))
    for p in (p0, p1):
        assert_clean(p)
