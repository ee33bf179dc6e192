"""`cowfs upgrade`: a store made by cowfs format version 1 (tests/data/store-v1.tar.gz, made
by that version's code: /run/model.bin written twice, then snapshot "first", then
/notes.txt) is refused with a clear error until upgraded, then reads and writes as before."""
from __future__ import annotations

import fcntl
import os
import sqlite3
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import save as st_save

from cowfs.errors import Busy, StoreError
from cowfs.store import ROOT_INO, Store
from cowfs.store.catalog.upgrade import _upgrade_catalog, upgrade
from cowfs.store.log.layout import CATALOG_FILE, FORMAT_VERSION, LOCK_FILE
from tests.support.storeutil import assert_clean

V1 = Path(__file__).parent.parent / "data" / "store-v1.tar.gz"
MODEL_V1 = bytes(range(256)) * 4096
MODEL_V2 = bytes(range(256)) * 4000 + b"v2"


def unpack(archive: Path, into: Path) -> Path:
    """An old store from tests/data, unpacked; its directory."""
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    version = archive.name.removeprefix("store-").split(".")[0]  # store-v1.tar.gz holds v1store/
    return into / f"{version}store"


@pytest.fixture
def v1_store(tmp_path: Path) -> Path:
    return unpack(V1, tmp_path)


def check_contents(path: Path) -> None:
    with Store.open(path) as s:
        assert s.read_file("/run/model.bin") == MODEL_V2
        first = s.snapshot("first").gen
        assert s.read_file("/run/model.bin", first) == MODEL_V2
        older = s.history("/run/model.bin")[-1]
        assert s.read_file("/run/model.bin", older.birth_gen) == MODEL_V1
        assert s.read_file("/notes.txt") == b"hello v1\n"
        # format 4 keeps nlink in each version row: filled in for the old rows by the upgrade
        assert s.getattr(ROOT_INO).nlink == 3 and s.getattr(ROOT_INO, first).nlink == 3
        assert s.getattr(ROOT_INO, 1).nlink == 2  # the empty store, before /run was made
        assert s.resolve("/run").nlink == 2 and s.resolve("/notes.txt").nlink == 1
        # format 5: atime (what stat showed before: the mtime), no device number, no xattrs
        notes = s.resolve("/notes.txt")
        assert notes.atime_ns == notes.mtime_ns and notes.rdev == 0 and s.listxattr(notes.ino) == []
        s.setxattr(notes.ino, b"user.k", b"v")  # the new columns work in an upgraded catalog
        assert s.getxattr(notes.ino, b"user.k") == b"v"
        s.removexattr(notes.ino, b"user.k")


def test_old_store_is_refused_with_the_command_to_run(v1_store: Path) -> None:
    with pytest.raises(StoreError, match=r"format version 1 .*cowfs upgrade"):
        Store.open(v1_store)


def test_upgrade_keeps_everything_and_the_store_works(v1_store: Path) -> None:
    assert upgrade(v1_store) == (1, FORMAT_VERSION)
    check_contents(v1_store)
    with Store.open(v1_store) as s:
        s.write_file("/run/model.bin", MODEL_V1 + b"v3")
        assert s.compact().bodies >= 1
        s.gc()
        assert s.read_file("/run/model.bin") == MODEL_V1 + b"v3"
    assert upgrade(v1_store) == (FORMAT_VERSION, FORMAT_VERSION)
    assert_clean(v1_store)


def test_upgrade_interrupted_after_the_catalog_finishes_next_time(v1_store: Path) -> None:
    _upgrade_catalog(v1_store / CATALOG_FILE)  # the crash: catalog done, config still says 1
    with pytest.raises(StoreError, match="cowfs upgrade"):
        Store.open(v1_store)
    assert upgrade(v1_store) == (1, FORMAT_VERSION)
    check_contents(v1_store)
    assert_clean(v1_store)


def test_upgrade_of_a_store_in_use_is_refused(v1_store: Path) -> None:
    fd = os.open(v1_store / LOCK_FILE, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with pytest.raises(Busy, match="in use"):
            upgrade(v1_store)
    finally:
        os.close(fd)
    assert upgrade(v1_store)[1] == FORMAT_VERSION


def test_cli_upgrade(v1_store: Path, tmp_path: Path) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "cowfs.cli", *args], capture_output=True, timeout=120)

    r = cli("ls", str(v1_store), "/")
    assert r.returncode != 0 and b"cowfs upgrade" in r.stderr and len(r.stderr.splitlines()) == 1
    r = cli("upgrade", str(v1_store))
    assert r.returncode == 0 and f"format version {FORMAT_VERSION} (upgraded from 1)".encode() in r.stdout
    r = cli("upgrade", str(v1_store))
    assert r.returncode == 0 and b"already" in r.stdout
    r = cli("upgrade", str(tmp_path / "nothing-here"))
    assert r.returncode != 0 and len(r.stderr.splitlines()) == 1
    check_contents(v1_store)


# tests/data/store-v2.tar.gz was made by format version 2's code (commit bdf4cd4): three
# checkpoints /checkpoint-{0,1,2}/model.safetensors of v2_series() below, compacted (the
# older two as deltas) and gc'd.
V2 = Path(__file__).parent.parent / "data" / "store-v2.tar.gz"


def model_series(seed: int, dtype: torch.dtype = torch.float32, n: int = 4) -> list[bytes]:
    """Two layers trained n steps: one safetensors file per step, saved in `dtype`."""
    g = torch.Generator().manual_seed(seed)
    w = {f"layers.{i}.weight": torch.randn(32, 256, generator=g) * 0.02 for i in range(2)}
    out = []
    for _ in range(n):
        w = {k: v - 1e-4 * torch.randn(v.shape, generator=g) for k, v in w.items()}
        out.append(st_save({k: v.to(dtype) for k, v in w.items()}))
    return out


def v2_series() -> list[bytes]:
    """The model files of the version 2 store, and one more checkpoint after them."""
    return model_series(0)


@pytest.fixture
def v2_store(tmp_path: Path) -> Path:
    return unpack(V2, tmp_path)


def test_version_2_store_is_refused_then_upgraded_with_its_lineage(v2_store: Path) -> None:
    files = v2_series()
    with pytest.raises(StoreError, match=r"format version 2 .*cowfs upgrade"):
        Store.open(v2_store)
    conn = sqlite3.connect(v2_store / CATALOG_FILE)
    heads = conn.execute("SELECT l.tensor_key, l.piece, c.first_gen, l.cid FROM lineage l"
                         " JOIN chunks c ON c.cid = l.cid").fetchall()
    conn.close()
    assert len(heads) == 2  # one piece per tensor, the newest (checkpoint-2's)
    assert upgrade(v2_store) == (2, FORMAT_VERSION)
    conn = sqlite3.connect(v2_store / CATALOG_FILE)
    assert sorted(conn.execute("SELECT tensor_key, piece, gen, cid FROM lineage").fetchall()) == sorted(heads)
    conn.close()
    with Store.open(v2_store) as s:
        for i in range(3):
            assert s.read_file(f"/checkpoint-{i}/model.safetensors") == files[i]
        assert s.getattr(ROOT_INO).nlink == 5
        s.mkdir(1, b"checkpoint-3")
        assert s.getattr(ROOT_INO).nlink == 6
        s.write_file("/checkpoint-3/model.safetensors", files[3])
        report = s.compact()
        assert report.recut == 1 and report.deltas == 2  # checkpoint-2's pieces lean on the new ones
        s.gc()
        for i in range(4):
            assert s.read_file(f"/checkpoint-{i}/model.safetensors") == files[i]
    assert_clean(v2_store)


# tests/data/store-v5.tar.gz was made by format version 5's code (commit b01fa6f): three bf16
# checkpoints /checkpoint-{0,1,2}/model.safetensors of model_series(5, bf16), compacted (the older
# two as subtraction deltas, codec 3) and gc'd, in a store of 4 MiB "file" segments.
V5 = Path(__file__).parent.parent / "data" / "store-v5.tar.gz"


def codec_counts(path: Path) -> dict[int, int]:
    conn = sqlite3.connect(path / CATALOG_FILE)
    try:
        return dict(conn.execute("SELECT codec, count(*) FROM chunks GROUP BY codec").fetchall())
    finally:
        conn.close()


# tests/data/store-v6.tar.gz was made by format version 6's code (commit 18950a3): three bf16
# checkpoints /checkpoint-{0,1,2}/model.safetensors of model_series(6, bf16), compacted (the
# older two's pieces as float deltas of 4 rANS states, codec 4) and gc'd, in a store of
# 4 MiB "file" segments.
V6 = Path(__file__).parent.parent / "data" / "store-v6.tar.gz"


@pytest.mark.parametrize("version, archive, seed, old_codecs", [
    (5, V5, 5, {0: 2, 1: 1, 3: 4}),  # the older pieces as subtraction deltas (codec 3)
    (6, V6, 6, {0: 3, 4: 4}),  # as float deltas of four states (codec 4)
])
def test_an_older_store_is_refused_then_upgraded_and_compacts_with_the_float_delta(
        version: int, archive: Path, seed: int, old_codecs: dict[int, int], tmp_path: Path) -> None:
    """Refused until upgraded; then its old records read as they are, and a new checkpoint's
    compaction writes codec 5 (32 states) beside them."""
    store = unpack(archive, tmp_path)
    files = model_series(seed, torch.bfloat16)
    with pytest.raises(StoreError, match=rf"format version {version} .*cowfs upgrade"):
        Store.open(store)
    assert codec_counts(store) == old_codecs
    assert upgrade(store) == (version, FORMAT_VERSION)
    with Store.open(store) as s:
        for i in range(3):
            assert s.read_file(f"/checkpoint-{i}/model.safetensors") == files[i]
        s.mkdir(1, b"checkpoint-3")
        s.write_file("/checkpoint-3/model.safetensors", files[3])
        assert s.compact().deltas == 2  # checkpoint-2's pieces lean on the new ones
        s.gc()
        for i in range(4):
            assert s.read_file(f"/checkpoint-{i}/model.safetensors") == files[i]
    counts = codec_counts(store)
    old = max(c for c in old_codecs if c)
    assert counts.get(5) == 2 and counts.get(old, 0) >= 2, counts  # checkpoint-0 and -1 keep theirs
    assert_clean(store)


def test_a_consumer_reads_version_5_to_7_catalogs_and_refuses_others(tmp_path: Path) -> None:
    """Schemas 6 and 7 only add codecs 4 and 5: a bucket catalog from a producer still at 5 or
    6 has the same tables and is read; any other version is refused with one line."""
    from cowfs.remote.source import check_schema
    catalog = unpack(V5, tmp_path) / CATALOG_FILE
    conn = sqlite3.connect(catalog, isolation_level=None)
    try:
        check_schema(conn, "v5.db")
        conn.execute("UPDATE meta SET value = 6 WHERE key = 'schema_version'")
        check_schema(conn, "v6.db")
        conn.execute("UPDATE meta SET value = 7 WHERE key = 'schema_version'")
        check_schema(conn, "v7.db")
        conn.execute("UPDATE meta SET value = 4 WHERE key = 'schema_version'")
        with pytest.raises(StoreError, match=r"v4.db: catalog schema version 4; this cowfs reads 5-7"):
            check_schema(conn, "v4.db")
    finally:
        conn.close()
