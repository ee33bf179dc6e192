"""The remote tier through a real mount and the CLI: `cowfs remote set/status/push/unset`, the
daemon's background uploads after each close, and a daemon killed with uploads to do."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from cowfs.remote.config import RemoteConfig
from tests.support.mountutil import cowfs, kill9, mounted, store_path  # noqa: F401 (a fixture)
from tests.support.remoteutil import bucket_objects, read_back
from tests.support.storeutil import data

UPLOAD_DEADLINE = 120.0  # seconds: generous, the machine may be busy


pytestmark = pytest.mark.usefixtures("aws_env")  # the engine's keys in AWS_* (conftest.py)


def status(target: Path) -> dict:
    return json.loads(cowfs("remote", "status", str(target), "--json").stdout)


def wait_uploaded(target: Path) -> dict:
    """Wait until the bucket holds the store's current generation; the status then."""
    deadline = time.monotonic() + UPLOAD_DEADLINE
    while True:
        s = status(target)
        if s["catalog_generation"] == s["generation"]:
            return s
        assert time.monotonic() < deadline, f"not uploaded in {UPLOAD_DEADLINE} s: {s}"
        time.sleep(0.2)


def test_cli_and_background_uploads(store_path, tmp_path, rgw, s3_bucket):
    url = f"s3://{s3_bucket.name}/run1"
    out = cowfs("remote", "set", str(store_path), url, "--endpoint", rgw.credentials.endpoint).stdout.decode()
    assert url in out
    assert status(store_path)["remote"] == url
    with mounted(store_path, tmp_path / "mnt") as mnt:
        (mnt / "run").mkdir()
        for k in range(3):
            (mnt / "run" / f"step-{k}.bin").write_bytes(data(1 << 20, k))
            s = wait_uploaded(mnt)
        assert s["packs"] >= 1 and s["last_error"] is None
        # a push by hand while mounted goes through the daemon, and finds nothing to do
        r = json.loads(cowfs("remote", "push", str(mnt), "--json").stdout)
        assert r["skipped"]
        cfg = RemoteConfig(url, endpoint=rgw.credentials.endpoint)
        uuid = json.loads((store_path / "cowfs-store.json").read_text())["store_uuid"]
        assert read_back(cfg, uuid, tmp_path) == {f"/run/step-{k}.bin": data(1 << 20, k) for k in range(3)}
        assert "removed" in cowfs("remote", "unset", str(mnt)).stdout.decode()
        (mnt / "run" / "after.bin").write_bytes(b"not uploaded")
        assert status(mnt)["remote"] is None
    assert not (store_path / "remote.json").exists()


def test_remote_set_on_a_mounted_store_and_errors(store_path, tmp_path, rgw, s3_bucket):
    with mounted(store_path, tmp_path / "mnt") as mnt:
        (mnt / "a.bin").write_bytes(data(300_000, 5))
        bad = cowfs("remote", "set", str(mnt), f"s3://{s3_bucket.name}/x", "--endpoint", "http://127.0.0.1:1", check=False)
        err = bad.stderr.decode()
        assert bad.returncode == 2 and "cannot reach" in err and err.count("\n") == 1
        bad = cowfs("remote", "set", str(mnt), "s3://missing-bucket-zz/x", "--endpoint", rgw.credentials.endpoint, check=False)
        assert bad.returncode == 2 and "does not exist" in bad.stderr.decode()
        assert status(mnt)["remote"] is None
        made = cowfs("remote", "set", str(mnt), "s3://made-by-cowfs-test/x", "--endpoint", rgw.credentials.endpoint,
                     "--create-bucket").stdout.decode()
        assert "bucket created" in made
        wait_uploaded(mnt)


def test_daemon_killed_with_uploads_to_do_resumes_after_remount(store_path, tmp_path, rgw, s3_bucket):
    url = f"s3://{s3_bucket.name}/k"
    cowfs("remote", "set", str(store_path), url, "--endpoint", rgw.credentials.endpoint)
    mnt = tmp_path / "mnt"
    with mounted(store_path, mnt):
        for k in range(4):
            (mnt / f"f{k}.bin").write_bytes(data(2 << 20, 60 + k))
        kill9(store_path, mnt)
    with mounted(store_path, mnt):
        s = wait_uploaded(mnt)
        assert s["generation"] >= 5
    objs = bucket_objects(RemoteConfig(url, endpoint=rgw.credentials.endpoint))
    packs = [k for k in objs if "/packs/" in k]
    assert all(k.replace("/packs/", "/index/") in objs for k in packs)
    assert sum(objs[k] for k in packs) < 8.2 * (1 << 20)  # nothing uploaded twice
    tmp = store_path / "tmp"
    assert not tmp.exists() or os.listdir(tmp) == []  # no catalog copy left behind
