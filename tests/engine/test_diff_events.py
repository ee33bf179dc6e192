"""Engine: diff between generations, and the change events a store publishes."""
from __future__ import annotations

import threading

import pytest

from cowfs import service
from cowfs.errors import InvalidArgument, NotFound
from cowfs.store import ROOT_INO, Store
from cowfs.store.catalog.events import Event
from tests.support.storeutil import data


def _by_path(report) -> dict[str, tuple]:  # type: ignore[no-untyped-def]
    return {e.path: (e.change, e.kind, e.size_a, e.size_b, e.shared_bytes) for e in report.entries}


def test_diff_added_removed_changed_and_shared_bytes(store: Store) -> None:
    run = store.mkdir(ROOT_INO, b"run")
    store.mkdir(run.ino, b"old")
    body = data(1_000_000, 1)
    store.write_file("/run/model.pt", body)
    store.write_file("/run/same.bin", b"same" * 1000)
    store.write_file("/run/gone.bin", b"g" * 5000)
    store.symlink(run.ino, b"last", b"model.pt")
    a = store.snapshot_create("a").gen

    edited = body[:500_000] + b"X" + body[500_001:]
    store.write_file("/run/model.pt", edited)                  # one chunk differs
    store.write_file("/run/same.bin", b"same" * 1000)          # written again, same bytes: unchanged
    store.unlink(run.ino, b"gone.bin")
    store.rmdir(run.ino, b"old")
    store.mkdir(run.ino, b"checkpoint-2")
    store.write_file("/run/checkpoint-2/copy.pt", body)        # every byte already held by a
    store.write_file("/run/checkpoint-2/fresh.bin", data(70_000, 9))
    store.unlink(run.ino, b"last")
    store.symlink(run.ino, b"last", b"checkpoint-2/copy.pt")   # retargeted
    store.setattr(store.resolve("/run/same.bin").ino, mode=0o600)
    store.write_file("/unchanged-later.bin", b"u")

    r = store.diff(a)
    got = _by_path(r)
    assert got["/run/gone.bin"] == ("removed", "file", 5000, None, 0)
    assert got["/run/old"] == ("removed", "dir", 0, None, 0)
    assert got["/run/checkpoint-2"] == ("added", "dir", None, 0, 0)
    assert got["/run/checkpoint-2/copy.pt"] == ("added", "file", None, 1_000_000, 1_000_000)
    assert got["/run/checkpoint-2/fresh.bin"] == ("added", "file", None, 70_000, 0)
    assert got["/unchanged-later.bin"][0] == "added"
    change, kind, size_a, size_b, shared = got["/run/model.pt"]
    assert (change, kind, size_a, size_b) == ("changed", "file", 1_000_000, 1_000_000)
    assert 1_000_000 - 300_000 < shared < 1_000_000  # all but the edited chunk (at most 256 KiB) is shared
    assert got["/run/last"][0] == "changed"
    assert got["/run/same.bin"][0] == "changed"  # chmod
    assert r.unchanged == 1 and "/run" not in got  # the directory itself is unchanged
    symlink_target = len("checkpoint-2/copy.pt")  # a symlink's size; it has no chunks to share
    assert r.new_bytes == (1_000_000 - shared) + 70_000 + 1 + symlink_target
    assert store.diff(a, a).entries == []
    back = _by_path(store.diff(store.generation, a))  # the other way round
    assert back["/run/gone.bin"][0] == "added" and back["/run/checkpoint-2"][0] == "removed"


def test_rewriting_identical_bytes_is_unchanged(store: Store) -> None:
    store.write_file("/f", data(300_000, 3))
    a = store.generation
    store.write_file("/f", data(300_000, 3))
    assert store.resolve("/f").content_id != store.resolve("/f", a).content_id
    r = store.diff(a)
    assert r.entries == [] and r.unchanged == 1


def test_service_diff_refs(store: Store) -> None:
    store.write_file("/f", b"1")
    store.snapshot_create("s1")
    store.write_file("/f", b"22")
    out = service.diff(store, "s1")
    assert out["b"]["ref"] == "@live" and out["summary"]["changed"] == 1
    assert out["entries"] == [{"change": "changed", "path": "/f", "kind": "file", "size_a": 1, "size_b": 2, "shared_bytes": 0}]
    gen = out["a"]["generation"]
    assert service.diff(store, f"@{gen}", "s1")["entries"] == []
    assert service.diff(store, "@live", "s1")["summary"]["changed"] == 1
    with pytest.raises(NotFound):
        service.diff(store, "nope")
    for bad in ("@0", "@999999", "@x", "@"):
        with pytest.raises(InvalidArgument):
            service.diff(store, bad)


def test_events_for_commits_renames_removals_and_snapshots(store: Store) -> None:
    got: list[Event] = []
    threads: set[str] = set()

    def listen(e: Event) -> None:
        got.append(e)
        threads.add(threading.current_thread().name)

    store.write_file("/before", b"not seen")
    stop = store.events.subscribe(listen)
    d = store.mkdir(ROOT_INO, b"d")
    store.write_file("/d/tmp", b"x" * 100_000)
    store.rename(d.ino, b"tmp", d.ino, b"model.pt")
    store.write_file("/d/model.pt", b"x" * 100_000)  # same bytes again: a version that stores nothing new
    snap = store.snapshot_create("s")
    store.unlink(d.ino, b"model.pt")
    store.restore("/d/model.pt", snap.gen)
    store.snapshot_delete("s")
    stop()
    store.write_file("/after", b"not seen")

    kinds = [(e.kind, e.path or e.snapshot) for e in got]
    assert kinds == [
        ("version", "/d/tmp"), ("rename", "/d/model.pt"), ("version", "/d/model.pt"), ("snapshot", "s"),
        ("remove", "/d/model.pt"), ("version", "/d/model.pt"), ("snapshot-delete", "s"),
    ]
    assert got[0].size == 100_000 and got[0].added_bytes == 100_000
    assert got[1].old_path == "/d/tmp" and got[1].size == 100_000
    assert got[2].added_bytes == 0 and got[5].added_bytes == 0
    gens = [e.generation for e in got]
    assert gens == sorted(gens) and len(set(gens)) == len(gens)
    assert got[3].generation == snap.gen
    assert got[0].to_json()["path"] == "/d/tmp" and "old_path" not in got[0].to_json()


def test_event_path_filter() -> None:
    e = Event("rename", 5, 0, "/run/model.pt", "/run/tmp/x")
    assert e.touches("/run") and e.touches("/run/model.pt") and e.touches("run/tmp") and e.touches("/")
    assert not e.touches("/ru") and not e.touches("/run/model")
    assert Event("snapshot", 6, 0, snapshot="s").touches("/anything")


def test_a_failing_subscriber_is_dropped_and_the_commit_stands(store: Store) -> None:
    def broken(_e: Event) -> None:
        raise RuntimeError("boom")

    store.events.subscribe(broken)
    store.write_file("/f", b"data")
    assert not store.events.active
    assert store.read_file("/f") == b"data"


def test_no_events_built_without_subscribers(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    from cowfs.store import store as store_module

    def fail(*_a: object) -> list[Event]:
        raise AssertionError("events built with no subscriber")

    monkeypatch.setattr(store_module, "version_events", fail)
    store.write_file("/f", b"data")
    assert store.read_file("/f") == b"data"
