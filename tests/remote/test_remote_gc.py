"""The bucket fsck against the real RGW: it names the paths a missing or damaged pack
affects, and exits 1."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from cowfs.errors import CorruptData
from cowfs.remote.config import RemoteConfig
from cowfs.remote.s3 import Bucket
from cowfs.remote.tier import tier_of
from cowfs.store import ROOT_INO, Store
from tests.support.mountutil import cowfs
from tests.support.remoteutil import bucket_objects, pack_names, read_back
from tests.support.storeutil import assert_clean, data, new_store


@pytest.fixture(autouse=True)
def aws_env(rgw, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", rgw.credentials.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", rgw.credentials.secret_key)


def configure(store: Store, rgw, bucket: str, prefix: str = "p") -> RemoteConfig:
    cfg = RemoteConfig(f"s3://{bucket}/{prefix}", endpoint=rgw.credentials.endpoint)
    tier_of(store).set(cfg)
    return cfg


def put_file(s: Store, name: str, blob: bytes) -> set[str]:
    """Write /run/NAME, push; returns the packs that push added."""
    cfg = tier_of(s).config
    assert cfg is not None
    before = pack_names(cfg)
    s.write_file(f"/run/{name}", blob)
    tier_of(s).push()
    return pack_names(cfg) - before


def one_store(tmp_path: Path, rgw, s3_bucket, name: str = "s", prefix: str = "p") -> tuple[Store, RemoteConfig]:
    s = Store.open(new_store(tmp_path / name))
    s.mkdir(ROOT_INO, b"run")
    return s, configure(s, rgw, s3_bucket.name, prefix)


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
    assert_clean(Path(path))
