"""Fixtures of the engine tests: every store a test touches is fsck'ed (clean) at teardown.

store_path is the Path of a new store (4 MiB segments); store is that store, open."""
from __future__ import annotations

import pytest

from cowfs.store import Store

SEGMENT_SIZE = 4 << 20


@pytest.fixture
def store_path(tmp_path, monkeypatch):
    """Path of a new, empty store; at teardown it is (re)opened and must fsck clean."""
    path = tmp_path / "store"
    Store.init(path, segment_size=SEGMENT_SIZE)
    opened: list[Store] = []
    real_open = Store.open.__func__

    def tracking_open(cls, p, *args, **kwargs):  # remember stores the test opens, to close any it left open
        s = real_open(cls, p, *args, **kwargs)
        opened.append(s)
        return s

    monkeypatch.setattr(Store, "open", classmethod(tracking_open))
    yield path
    for s in opened:
        s.close()  # no-op when already closed; otherwise the lock would make the reopen fail
    with real_open(Store, path) as s:
        report = s.fsck()
    assert report.clean, "fsck found problems:\n" + "\n".join(p.line() for p in report.problems)


@pytest.fixture
def store(store_path):
    """An open store, closed before store_path's fsck reopens it."""
    s = Store.open(store_path)
    yield s
    s.close()
