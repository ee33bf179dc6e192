"""One namespace for the stores of a job (docs/design.md section 17, "One namespace for a
job"): stores on "nodes" (here two or three stores and mounts on this machine) upload into
one prefix; a consumer with `--all-stores` shows the union, follows stores as they appear
(also when it was mounted before any), applies the clash rule (the later commit wins, by
the stores' generations, which each producer moves past the generations its peers'
notices name), and follows a store that sends no notices by looking at the bucket."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from cowfs.store.log.layout import read_config
from tests.support.consumerutil import Consumer, Watch, drain, has_bytes, wait_for
from tests.support.mountutil import cowfs, mounted
from tests.support.storeutil import assert_clean, data, new_store


pytestmark = pytest.mark.usefixtures("aws_env")  # the engine's keys in AWS_* (conftest.py)


@pytest.fixture
def stores(tmp_path):
    paths = [new_store(tmp_path / f"node{i}", segment_size=16 << 20) for i in range(3)]
    yield paths
    for p in paths:
        assert_clean(p)


def generation(mnt: Path) -> int:
    return int(json.loads(cowfs("stats", str(mnt), "--json").stdout)["generations"])


def uploaded(mnt: Path) -> int:
    return int(json.loads(cowfs("remote", "status", str(mnt), "--json").stdout)["catalog_generation"])


@pytest.mark.long
def test_a_consumer_of_every_store_shows_the_union_and_the_later_commit(stores, tmp_path, rgw, s3_bucket):
    url = f"s3://{s3_bucket.name}/job"
    endpoint = rgw.credentials.endpoint
    # an evaluation service mounted before training starts: the prefix is empty
    with Consumer(url, endpoint, tmp_path / "cons", tmp_path / "cache", "--all-stores") as cons:
        assert list(cons.iterdir()) == []
        for p in stores[:2]:
            cowfs("remote", "set", str(p), url, "--endpoint", endpoint, "--notify", "127.0.0.1:0")
        with mounted(stores[0], tmp_path / "n0") as n0, mounted(stores[1], tmp_path / "n1") as n1, \
                Watch(cons) as seen:
            for rank, node in enumerate((n0, n1, n0, n1)):  # the ranks' files, each node its own
                step = node / "run1" / "step-1"
                step.mkdir(parents=True, exist_ok=True)
                (step / f"__{rank}_0.distcp").write_bytes(data(1 << 20, rank))
            for rank in range(4):
                wait_for(f"rank {rank}'s file", lambda r=rank: has_bytes(
                    cons / "run1" / "step-1" / f"__{r}_0.distcp", data(1 << 20, r)))
            assert sorted(p.name for p in (cons / "run1" / "step-1").iterdir()) == [
                f"__{r}_0.distcp" for r in range(4)]
            events = drain(seen, lambda e: e.get("path") == "/run1/step-1/__3_0.distcp")
            assert {e["path"] for e in events if e["kind"] == "version"} >= {"/run1/step-1/__1_0.distcp"}
            # the clash rule: the same path written on both nodes, one after the other; each
            # node has seen the other's generation (its peer's notices) before it writes
            latest = cons / "run1" / "latest"
            for k, (node, other) in enumerate(((n0, n1), (n1, n0), (n0, n1))):
                (node / "run1" / "latest").write_text(f"step-{k}")
                gen = generation(node)
                wait_for("the upload", lambda node=node, gen=gen: uploaded(node) >= gen)
                wait_for("the peer's clock past it", lambda other=other, gen=gen: generation(other) >= gen)
                wait_for(f"latest from write {k}", lambda k=k: has_bytes(latest, f"step-{k}".encode()))
            # the winner's file removed: the other node's version shows again
            (n0 / "run1" / "latest").unlink()
            wait_for("n1's latest again", lambda: has_bytes(latest, b"step-1"))
            (n1 / "run1" / "latest").unlink()
            wait_for("no latest", lambda: not latest.exists())
            # those steps came as notices that carried their objects, applied from them
            assert "notices' indexes" in (tmp_path / "cache" / "cowfs.log").read_text()
            # a third store that sends no notices: followed by looks at the bucket
            cowfs("remote", "set", str(stores[2]), url, "--endpoint", endpoint)
            with mounted(stores[2], tmp_path / "n2") as n2:
                (n2 / "run1" / "step-1").mkdir(parents=True)
                (n2 / "run1" / "step-1" / "__4_0.distcp").write_bytes(data(1 << 20, 4))
                wait_for("the third store's file", lambda: has_bytes(
                    cons / "run1" / "step-1" / "__4_0.distcp", data(1 << 20, 4)))
                uuid2 = read_config(stores[2]).store_uuid
                said = f"store {uuid2} sends no notices"
                wait_for("the consumer says it looks at the bucket for it", lambda: said in (
                    tmp_path / "cache" / "cowfs.log").read_text())
                (n2 / "run1" / "step-1" / "__4_0.distcp").write_bytes(data(1 << 20, 5))
                wait_for("its next version, by a look", lambda: has_bytes(
                    cons / "run1" / "step-1" / "__4_0.distcp", data(1 << 20, 5)))
        assert (tmp_path / "cache" / "cowfs.log").read_text().count(said) == 1
    # a consumer mounted after all of it gets the same tree at once
    with Consumer(url, endpoint, tmp_path / "cons", tmp_path / "cache2", "--all-stores") as cons:
        for rank in range(5):
            assert (cons / "run1" / "step-1" / f"__{rank}_0.distcp").read_bytes() == data(1 << 20, 5 if rank == 4 else rank)


def test_all_stores_and_store_together_are_refused(tmp_path, rgw, s3_bucket):
    (tmp_path / "m").mkdir()
    r = cowfs("mount", f"s3://{s3_bucket.name}/job", str(tmp_path / "m"), "--cache", str(tmp_path / "c"),
              "--endpoint", rgw.credentials.endpoint, "--all-stores", "--store", "x", check=False)
    assert r.returncode == 2 and r.stderr.decode().count("\n") == 1 and "--all-stores" in r.stderr.decode()
    r = cowfs("mount", f"s3://{s3_bucket.name}/empty", str(tmp_path / "m"), "--cache", str(tmp_path / "c"),
              "--endpoint", rgw.credentials.endpoint, check=False)
    assert r.returncode != 0 and "--all-stores" in r.stderr.decode()
