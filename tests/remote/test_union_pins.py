"""Snapshots of the union pinned in the bucket (docs/design.md section 17, "Pinned
snapshots"): a consumer of every store with `--snapshot-on checkpoint` snapshots a DCP
checkpoint written across two stores once every file its `.metadata` names is there (also
when a rank's file arrives after the `.metadata`), pins it in the bucket, and the pin keeps
what it shows through the stores' prune and remote gc; every later `--all-stores` mount
shows it, and `cowfs restore --into` copies it out; deleting it lets remote gc take its packs."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.checkpointutil import dcp_metadata
from tests.support.consumerutil import Consumer, Watch, drain, has_bytes, wait_for
from tests.support.mountutil import cowfs, mounted
from tests.support.storeutil import assert_clean, data, new_store

SNAP = "run1@step-1"
MIB = 1 << 20


pytestmark = pytest.mark.usefixtures("aws_env")  # the engine's keys in AWS_* (conftest.py)


@pytest.fixture
def stores(tmp_path):
    paths = [new_store(tmp_path / f"node{i}", segment_size=16 << 20) for i in range(2)]
    yield paths
    for p in paths:
        assert_clean(p)


def keys(s3_bucket, prefix: str) -> list[str]:
    resp = s3_bucket.client.list_objects_v2(Bucket=s3_bucket.name, Prefix=prefix)
    return sorted(o["Key"] for o in resp.get("Contents", []))


def names(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir())


def snapshots(mnt: Path) -> list[str]:
    return [s["name"] for s in json.loads(cowfs("snapshot", "list", str(mnt), "--json").stdout)]


def gc_until_deleted(stores: list[Path]) -> int:
    """`cowfs remote gc --grace 2s` on each store until a sweep deleted packs (a mark needs
    packs older than the grace period, a sweep a list that old); the packs deleted."""
    deleted = 0

    def one_round() -> bool:
        nonlocal deleted
        for p in stores:
            deleted += json.loads(cowfs("remote", "gc", str(p), "--grace", "2s", "--json").stdout)["deleted_packs"]
        return deleted > 0

    wait_for("remote gc to delete packs", one_round)
    return deleted


@pytest.mark.long
def test_a_checkpoint_whole_across_stores_is_pinned_and_outlives_its_stores_history(stores, tmp_path, rgw, s3_bucket):
    url = f"s3://{s3_bucket.name}/job"
    endpoint = rgw.credentials.endpoint
    for p in stores:
        cowfs("remote", "set", str(p), url, "--endpoint", endpoint, "--notify", "127.0.0.1:0")
    step = Path("run1") / "step-1"
    with mounted(stores[0], tmp_path / "n0") as n0, mounted(stores[1], tmp_path / "n1") as n1:
        (n0 / "run1").mkdir()
        (n0 / "run1" / "seen").write_bytes(b"x")  # every store has uploaded once: the consumer follows both
        (n1 / "run1").mkdir()
        (n1 / "run1" / "seen-1").write_bytes(b"x")
        with Consumer(url, endpoint, tmp_path / "cons", tmp_path / "cache", "--all-stores",
                      "--snapshot-on", "checkpoint") as cons, Watch(cons) as seen:
            wait_for("both stores", lambda: (cons / "run1" / "seen-1").exists() and (cons / "run1" / "seen").exists())
            (n0 / step).mkdir()
            (n0 / step / "__0_0.distcp").write_bytes(data(MIB, 0))
            (n0 / step / ".metadata").write_bytes(dcp_metadata(2))  # names rank 1's file, not there yet
            drain(seen, lambda e: e.get("path") == f"/{step}/.metadata")
            (n1 / step).mkdir()
            (n1 / step / "__1_0.distcp").write_bytes(data(MIB, 1))
            events = drain(seen, lambda e: e["kind"] == "snapshot")
            assert events[-1]["snapshot"] == SNAP
            assert any(e.get("path") == f"/{step}/__1_0.distcp" for e in events), "pinned before rank 1's file came"
            assert snapshots(cons) == [SNAP]
            assert keys(s3_bucket, "job/pins/") == [f"job/pins/{SNAP}.db.zst"]
            shown = cons / ".snapshots" / SNAP / step
            assert names(shown) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
            assert (shown / "__1_0.distcp").read_bytes() == data(MIB, 1)
            # a snapshot taken by hand is pinned too, and deleted with its pin
            cowfs("snapshot", "create", str(cons), "by-hand")
            assert keys(s3_bucket, "job/pins/") == ["job/pins/by-hand.db.zst", f"job/pins/{SNAP}.db.zst"]
            r = cowfs("snapshot", "create", str(cons), "by-hand", check=False)
            assert r.returncode != 0 and "already exists" in r.stderr.decode() and r.stderr.decode().count("\n") == 1
            cowfs("snapshot", "delete", str(cons), "by-hand")
            assert keys(s3_bucket, "job/pins/") == [f"job/pins/{SNAP}.db.zst"]
            # a later file is not in the snapshot, which shows its merged generation
            (n0 / step / "late").write_bytes(b"after")
            wait_for("the late file", lambda: has_bytes(cons / step / "late", b"after"))
        # the stores drop the checkpoint and its history, and remote gc runs: the pinned
        # packs stay (a second, unpinned checkpoint's go)
        (n1 / "run1" / "step-2").mkdir()
        (n1 / "run1" / "step-2" / "__1_0.distcp").write_bytes(data(MIB, 2))  # never complete: not pinned
        for node in (n0, n1):
            for f in (node / "run1").rglob("*"):
                if f.is_file():
                    f.unlink()
        for node in (n0, n1):
            cowfs("prune", str(node), "--keep-last", "1")
            cowfs("remote", "push", str(node))
        assert gc_until_deleted(stores) > 0
        r = json.loads(cowfs("remote", "fsck", str(n0), "--json").stdout)
        assert r["clean"] and r["pins"] == [SNAP], r  # the pin's chunks checked like a catalog's
        # a new consumer, with an empty cache, shows the pin whole from the bucket (a pin file a
        # killed daemon left in the cache is deleted at start)
        (tmp_path / "cache2").mkdir()
        (tmp_path / "cache2" / "pin-build-1-2.db").write_bytes(b"cut short")
        with Consumer(url, endpoint, tmp_path / "cons", tmp_path / "cache2", "--all-stores") as cons:
            assert not (tmp_path / "cache2" / "pin-build-1-2.db").exists()
            assert snapshots(cons) == [SNAP]
            shown = cons / ".snapshots" / SNAP / step
            assert names(shown) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
            for rank in range(2):
                assert (shown / f"__{rank}_0.distcp").read_bytes() == data(MIB, rank)
            assert (shown / ".metadata").read_bytes() == dcp_metadata(2)
            # restored from the union: copied out of the pinned snapshot onto a plain disk
            cowfs("restore", str(cons), f"/{step}", "--snapshot", SNAP, "--into", str(tmp_path / "restored"))
            assert names(tmp_path / "restored") == [".metadata", "__0_0.distcp", "__1_0.distcp"]
            for rank in range(2):
                assert (tmp_path / "restored" / f"__{rank}_0.distcp").read_bytes() == data(MIB, rank)
            assert list((cons / step).iterdir()) == []  # the live tree has lost them
            cowfs("snapshot", "delete", str(cons), SNAP)
            assert snapshots(cons) == [] and keys(s3_bucket, "job/pins/") == []
        assert gc_until_deleted(stores) > 0  # the packs only the pin held
        r = json.loads(cowfs("remote", "fsck", str(n0), "--json").stdout)
        assert r["clean"] and r["pins"] == [], r


def test_snapshot_on_needs_every_store_and_one_store_takes_none(stores, tmp_path, rgw, s3_bucket):
    url = f"s3://{s3_bucket.name}/job"
    cowfs("remote", "set", str(stores[0]), url, "--endpoint", rgw.credentials.endpoint)
    cowfs("remote", "push", str(stores[0]))
    (tmp_path / "m").mkdir()
    r = cowfs("mount", url, str(tmp_path / "m"), "--read-only", "--cache", str(tmp_path / "c"),
              "--endpoint", rgw.credentials.endpoint, "--snapshot-on", "checkpoint", check=False)
    assert r.returncode != 0 and "--all-stores" in r.stderr.decode() and r.stderr.decode().count("\n") == 1
    with Consumer(url, rgw.credentials.endpoint, tmp_path / "m", tmp_path / "c") as cons:
        r = cowfs("snapshot", "create", str(cons), "s1", check=False)
        assert r.returncode != 0 and "--all-stores" in r.stderr.decode()
    assert keys(s3_bucket, "job/pins/") == []


def test_a_pin_whose_packs_are_gone_is_named_by_the_bucket_fsck(stores, tmp_path, rgw, s3_bucket):
    url = f"s3://{s3_bucket.name}/job"
    cowfs("remote", "set", str(stores[0]), url, "--endpoint", rgw.credentials.endpoint)
    with mounted(stores[0], tmp_path / "n0") as n0:
        (n0 / "weights.bin").write_bytes(data(MIB, 3))
        cowfs("remote", "push", str(n0))
        with Consumer(url, rgw.credentials.endpoint, tmp_path / "cons", tmp_path / "cache", "--all-stores") as cons:
            wait_for("the file", lambda: has_bytes(cons / "weights.bin", data(MIB, 3)))
            cowfs("snapshot", "create", str(cons), "p1")
        packs = keys(s3_bucket, "job/packs/")
        assert packs
        s3_bucket.client.delete_objects(Bucket=s3_bucket.name, Delete={"Objects": [{"Key": k} for k in packs]})
        r = cowfs("remote", "fsck", str(n0), "--json", check=False)
        report = json.loads(r.stdout)
        assert r.returncode == 1 and not report["clean"] and report["pins"] == ["p1"]
        assert any("pinned snapshot p1" in line and "/weights.bin" in line for line in report["problems"]), report
        (n0 / "weights.bin").unlink()  # the store's fsck at the end needs nothing from the bucket


def test_a_checkpoint_completed_before_the_consumer_mounted_is_pinned_once(stores, tmp_path, rgw, s3_bucket):
    url = f"s3://{s3_bucket.name}/job"
    cowfs("remote", "set", str(stores[0]), url, "--endpoint", rgw.credentials.endpoint)
    with mounted(stores[0], tmp_path / "n0") as n0:
        (n0 / "run" / "step-0").mkdir(parents=True)
        (n0 / "run" / "step-0" / "__0_0.distcp").write_bytes(data(MIB, 9))
        (n0 / "run" / "step-0" / ".metadata").write_bytes(dcp_metadata(1))
        (n0 / "run" / "step-1").mkdir()
        (n0 / "run" / "step-1" / ".metadata").write_bytes(dcp_metadata(1))  # its data file never came
        cowfs("remote", "push", str(n0))
        for cache in ("cache", "cache2"):  # a second consumer, later, finds the pin and takes none
            with Consumer(url, rgw.credentials.endpoint, tmp_path / "cons", tmp_path / cache, "--all-stores",
                          "--snapshot-on", "checkpoint") as cons:
                wait_for("the pin of step-0", lambda: snapshots(cons) == ["run@step-0"])
                assert keys(s3_bucket, "job/pins/") == ["job/pins/run@step-0.db.zst"]
                assert (cons / ".snapshots" / "run@step-0" / "run" / "step-0" / "__0_0.distcp").read_bytes() == \
                    data(MIB, 9)
        assert "of /run/step-0, pinned in the bucket" in (tmp_path / "cache" / "cowfs.log").read_text()
        assert "pinned in the bucket" not in (tmp_path / "cache2" / "cowfs.log").read_text()  # the second took none
