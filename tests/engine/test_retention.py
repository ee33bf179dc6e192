"""Prune rules against a table of snapshot times (a fake clock), and prune/restore on real stores."""
from __future__ import annotations

import datetime
import json

import pytest

from cowfs.errors import InvalidArgument
from cowfs.store import ROOT_INO, Snapshot, Store
from cowfs.store.upkeep.retention import KeepPolicy, plan
from cowfs.units import duration_ns
from tests.support.mountutil import cowfs, mounted
from tests.support.storeutil import data

H = 3600 * 10**9


def snaps(*hours_ago: float, base: str = "2026-11-22T12:00:00") -> list[Snapshot]:
    t0 = int(datetime.datetime.fromisoformat(base).replace(tzinfo=datetime.timezone.utc).timestamp() * 1e9)
    return [Snapshot(f"s{i}", i + 1, t0 - int(h * H)) for i, h in enumerate(hours_ago)]


def kept(decisions) -> list[str]:
    return sorted(d.snapshot.name for d in decisions if d.keep)


TABLE = [
    # (hours ago of each snapshot, policy, names kept)
    ((0, 1, 2, 3, 4), KeepPolicy(last=2), ["s0", "s1"]),
    ((0, 1, 2, 30), KeepPolicy(within_ns=duration_ns("2h")), ["s0", "s1", "s2"]),
    ((0, 0.2, 0.5, 1.1, 1.5, 2.5), KeepPolicy(hourly=3), ["s0", "s1", "s3"]),  # newest of hours 12, 11, 10
    ((0, 5, 13, 25, 26, 50), KeepPolicy(daily=2), ["s0", "s2"]),  # 11-22 12:00, 11-21 23:00
    ((0, 24 * 3, 24 * 8, 24 * 9, 24 * 20), KeepPolicy(weekly=2), ["s0", "s2"]),
    ((0, 1, 2), KeepPolicy(names=("s1",)), ["s1"]),
    ((0, 1, 2, 3), KeepPolicy(last=1, names=("s3",)), ["s0", "s3"]),  # any rule keeps
    ((0, 1, 2, 3), KeepPolicy(last=10), ["s0", "s1", "s2", "s3"]),
]


@pytest.mark.parametrize("hours, policy, want", TABLE)
def test_keep_rules(hours, policy, want):
    assert kept(plan(snaps(*hours), policy)) == want


def test_reasons_and_refusal():
    d = plan(snaps(0, 1), KeepPolicy(last=1, within_ns=duration_ns("30m")))
    assert d[0].reasons == ["last 1", "within"] and d[1].reasons == []
    with pytest.raises(InvalidArgument, match="no keep rule"):
        plan(snaps(0), KeepPolicy())
    with pytest.raises(InvalidArgument):
        duration_ns("soon")
    assert duration_ns("1d12h") == 36 * H


def _series(store):
    with Store.open(store) as s:
        s.mkdir(ROOT_INO, b"run")
        for i in range(6):
            s.write_file("/run/model.pt", data(1_500_000, i))
            s.snapshot_create(f"step-{i}")
        return s.stats()


def test_prune_keep_last_reclaims_space_and_keeps_snapshots_exact(store_path):
    _series(store_path)
    with Store.open(store_path) as s:  # after a clean close (the head segment's preallocation is released)
        before = s.stats()
    r = cowfs("prune", str(store_path), "--keep-last", "3", "--dry-run", "--json")
    plan_ = json.loads(r.stdout)
    assert [s["keep"] for s in plan_["snapshots"]] == [True] * 3 + [False] * 3
    with Store.open(store_path) as s:
        assert len(s.snapshot_list()) == 6 and s.stats()["physical_bytes"] == before["physical_bytes"]  # dry run
    out = cowfs("prune", str(store_path), "--keep-last", "3").stdout.decode()
    assert "remove" in out and "freed" in out
    with Store.open(store_path) as s:
        assert [x.name for x in s.snapshot_list()] == ["step-3", "step-4", "step-5"]
        for i in (3, 4, 5):
            assert s.read_file("/run/model.pt", s.snapshot(f"step-{i}").gen) == data(1_500_000, i)
        st = s.stats()
        assert st["stored_bytes"] == 3 * 1_500_000  # the live tree is step-5's version
        assert st["physical_bytes"] < before["physical_bytes"] * 0.6


def test_prune_refuses_without_rules_and_keeps_history_when_asked(store_path):
    _series(store_path)
    r = cowfs("prune", str(store_path), check=False)
    assert r.returncode == 2 and b"no keep rule" in r.stderr
    cowfs("prune", str(store_path), "--keep-last", "1", "--keep-history", "1d")
    with Store.open(store_path) as s:
        assert len(s.history("/run/model.pt")) == 6  # replaced within a day: kept


def test_restore_makes_old_version_current_keeping_history(store_path, tmp_path):
    _series(store_path)
    cowfs("restore", str(store_path), "/run/model.pt", "--snapshot", "step-1")
    with Store.open(store_path) as s:
        assert s.read_file("/run/model.pt") == data(1_500_000, 1)
        assert len(s.history("/run/model.pt")) == 7
        stored = s.stats()["stored_bytes"]
    cowfs("restore", str(store_path), "/run/model.pt", "--snapshot", "step-2", "--to", "/run/old.pt")
    with Store.open(store_path) as s:
        assert s.read_file("/run/old.pt") == data(1_500_000, 2) and s.stats()["stored_bytes"] == stored
    r = cowfs("restore", str(store_path), "/run/model.pt", "--snapshot", "nope", check=False)
    assert r.returncode == 2 and b"no snapshot named" in r.stderr


@pytest.mark.mount
def test_prune_and_restore_on_a_mounted_store(store_path, tmp_path):
    _series(store_path)
    with mounted(store_path, tmp_path / "mnt") as m:
        assert (m / "run" / "model.pt").read_bytes() == data(1_500_000, 5)
        cowfs("restore", str(m), "/run/model.pt", "--snapshot", "step-0")
        assert (m / "run" / "model.pt").read_bytes() == data(1_500_000, 0)
        cowfs("prune", str(m), "--keep-last", "2")
        assert sorted(p.name for p in (m / ".snapshots").iterdir()) == ["step-4", "step-5"]
        assert (m / ".snapshots" / "step-4" / "run" / "model.pt").read_bytes() == data(1_500_000, 4)
