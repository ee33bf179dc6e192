"""The cowfs command line on an unmounted store: outputs, exit codes, errors."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from cowfs.store import Store

from tests.support.storeutil import assert_clean, data, store_with_history


def run(*args: str, input: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cowfs.cli", *args], capture_output=True, input=input, timeout=120)


@pytest.fixture
def history_path(tmp_path):
    """Path of a store holding two versions of /run/model.pt (the first in snapshot "one"),
    fsck'ed clean at teardown."""
    p = store_with_history(tmp_path / "store", 500_000)
    yield p
    assert_clean(p)


def test_stats_json_and_table(history_path):
    r = run("stats", str(history_path), "--json")
    assert r.returncode == 0
    stats = json.loads(r.stdout)
    for key in ("logical_bytes", "stored_bytes", "physical_bytes", "files", "versions", "snapshots", "generations", "dedup_ratio"):
        assert key in stats
    assert stats["files"] == 1 and stats["snapshots"] == 1 and stats["stored_bytes"] == 1_000_000
    assert "dedup_ratio" in run("stats", str(history_path)).stdout.decode()


def test_snapshots_log_cat_ls(history_path):
    assert run("snapshot", "create", str(history_path), "two").returncode == 0
    r = run("snapshot", "list", str(history_path), "--json")
    assert [s["name"] for s in json.loads(r.stdout)] == ["one", "two"]
    r = run("cat", str(history_path), "/run/model.pt", "--snapshot", "one")
    assert r.returncode == 0 and r.stdout == data(500_000, 1)
    assert run("cat", str(history_path), "/run/model.pt").stdout == data(500_000, 2)
    log = json.loads(run("log", str(history_path), "/run/model.pt", "--json").stdout)
    assert [v["size"] for v in log][:2] == [500_000, 500_000] and log[0]["current"]
    assert b"model.pt" in run("ls", str(history_path), "/run").stdout
    assert run("snapshot", "delete", str(history_path), "one", "two").returncode == 0
    assert json.loads(run("snapshot", "list", str(history_path), "--json").stdout) == []
    r = run("gc", str(history_path))
    assert r.returncode == 0 and b"freed" in r.stdout
    r = run("compact", str(history_path))  # nothing recognised in it: nothing re-cut
    assert r.returncode == 0 and r.stdout.startswith(b"compact: 0 of ") and not r.stderr
    r = run("compact", str(history_path), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["bodies"] == 0
    assert b"codec raw" in run("stats", str(history_path)).stdout
    log = json.loads(run("log", str(history_path), "/run/model.pt", "--json").stdout)
    assert log[0]["added_stored_bytes"] == log[0]["added_bytes"]  # raw records: stored as they are


@pytest.mark.parametrize(
    "args, message",
    [
        (("stats", "{tmp}/missing"), "no such directory"),
        (("stats", "{tmp}"), "not a cowfs store"),
        (("init", "{store}"), "already a cowfs store"),
        (("snapshot", "create", "{store}", ".hidden"), "invalid snapshot name"),
        (("snapshot", "create", "{store}", "one"), "already exists"),
        (("snapshot", "delete", "{store}", "nope"), "no snapshot named"),
        (("cat", "{store}", "/run/missing.pt"), "no such file"),
        (("cat", "{store}", "/run/model.pt", "--snapshot", "nope"), "no snapshot named"),
        (("init", "{tmp}/new", "--segment-size", "12x"), "not a size"),
        (("init", "{tmp}/new", "--read-chain", "5"), "read chain must be 1 to 4"),
        (("config", "{store}", "--read-chain", "0"), "read chain must be 1 to 4"),
        (("config", "{store}", "--read-chain", "two"), "invalid int value"),
        (("config", "{tmp}", "--read-chain", "2"), "not a cowfs store"),
    ],
)
def test_bad_input_is_one_line_exit_2(history_path, tmp_path, args, message):
    before = {f: os.stat(history_path / f).st_mtime_ns for f in ("cowfs-store.json",)}
    r = run(*(a.format(tmp=tmp_path, store=history_path) for a in args))
    err = r.stderr.decode()
    assert r.returncode == 2, err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err
    assert before == {f: os.stat(history_path / f).st_mtime_ns for f in before}


def test_fsck_exit_codes(history_path):
    r = run("fsck", str(history_path), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["clean"]
    with Store.open(history_path) as s:
        seg, off = s.catalog.reader().execute("SELECT seg_id, offset FROM chunks LIMIT 1").fetchone()
    seg_file = history_path / "segments" / f"{seg:016d}.seg"
    with open(seg_file, "r+b") as f:
        f.seek(off + 100)
        b = f.read(1)
        f.seek(off + 100)
        f.write(bytes([b[0] ^ 1]))
    r = run("fsck", str(history_path))
    assert r.returncode == 1 and b"chunk" in r.stdout and b"/run/model.pt" in r.stdout
    r = run("fsck", str(history_path), "--repair")
    assert r.returncode == 0, r.stdout
    assert run("fsck", str(history_path)).returncode == 0


def test_help_has_examples():
    for cmd in ("init", "config", "fsck", "stats", "gc", "log", "cat", "ls"):
        r = run(cmd, "--help")
        assert r.returncode == 0 and b"example:" in r.stdout


@pytest.mark.parametrize("args", [(), ("nope",), ("snapshot",), ("restore", "/tmp", "/x", "--generation", "abc"),
                                  ("prune", "/tmp", "--keep-last", "x"), ("diff",), ("mount", "/tmp")])
def test_usage_errors_are_one_line(args):
    r = run(*args)
    err = r.stderr.decode()
    assert r.returncode == 2 and err.startswith("cowfs: ") and "--help" in err and len(err.splitlines()) == 1, err
    assert r.stdout == b""


def test_config_shows_and_changes_the_read_chain(tmp_path):
    store = tmp_path / "store"
    assert run("init", str(store), "--read-chain", "3").returncode == 0
    shown = json.loads(run("config", str(store), "--json").stdout)
    assert shown["read_chain"] == 3 and shown["device"] and shown["format_version"] >= 7
    r = run("config", str(store), "--read-chain", "1")
    assert r.returncode == 0 and "was 3" in r.stdout.decode()
    text = run("config", str(store)).stdout.decode()
    assert "read_chain      1" in text and "segment_size    256.0 MiB" in text
    with Store.open(store):  # in use (as by a mount's daemon): refused, nothing changed
        r = run("config", str(store), "--read-chain", "2")
        err = r.stderr.decode()
        assert r.returncode == 2 and "unmount it first" in err and err.count("\n") == 1
    assert json.loads(run("config", str(store), "--json").stdout)["read_chain"] == 1
    assert_clean(store)


def test_a_store_without_the_setting_reads_through_the_formats_bound(tmp_path):
    store = tmp_path / "store"
    Store.init(store)
    cfg = json.loads((store / "cowfs-store.json").read_text())
    del cfg["read_chain"]  # as a store made before the setting
    (store / "cowfs-store.json").write_text(json.dumps(cfg))
    assert json.loads(run("config", str(store), "--json").stdout)["read_chain"] == 4
    cfg["read_chain"] = "many"
    (store / "cowfs-store.json").write_text(json.dumps(cfg))
    r = run("stats", str(store))
    assert r.returncode == 2 and "read chain must be 1 to 4" in r.stderr.decode()


def test_config_of_a_consumers_mount_says_what_it_is(tmp_path, monkeypatch, capsys):
    from cowfs import cli, control
    cache, mnt = tmp_path / "cache", tmp_path / "mnt"
    cache.mkdir()
    mnt.mkdir()
    monkeypatch.setattr(control, "mounted_cowfs", lambda: {str(mnt): str(cache)})  # as mountinfo names a replica
    assert cli.main(["config", str(mnt)]) == 2
    err = capsys.readouterr().err
    assert "consumer's mount" in err and err.count("\n") == 1
