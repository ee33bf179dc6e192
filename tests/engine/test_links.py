"""Hard links in the engine: one inode, several names (link count in each version row),
versions seen through every name, history and snapshots per inode, fsck of the counts."""
from __future__ import annotations

import pytest

from cowfs.errors import Exists, NotPermitted
from cowfs.store import ROOT_INO, Store

from tests.support.storeutil import assert_clean, data


def test_link_unlink_rename_keep_the_inode_and_its_count(store_path):
    path = store_path
    with Store.open(path) as s:
        d = s.mkdir(ROOT_INO, b"d")
        f = s.write_file("/d/a", data(300_000, 1))
        attr = s.link(f.ino, ROOT_INO, b"b")
        assert attr.ino == f.ino and attr.nlink == 2
        assert s.resolve("/b").nlink == 2 and s.read_file("/b") == data(300_000, 1)
        assert sorted(s.paths_of(f.ino)) == ["/b", "/d/a"]
        with pytest.raises(Exists):
            s.link(f.ino, d.ino, b"a")
        with pytest.raises(NotPermitted):
            s.link(d.ino, ROOT_INO, b"d2")
        s.write_file("/b", data(200_000, 2))  # a new version through one name
        assert s.read_file("/d/a") == data(200_000, 2)
        assert len(s.history("/d/a")) == len(s.history("/b")) >= 2  # one inode, one history
        snap = s.snapshot_create("two-names").gen
        assert s.rename(ROOT_INO, b"b", d.ino, b"a") is None  # two names of one inode: nothing happens
        assert s.resolve("/b").ino == s.resolve("/d/a").ino
        s.unlink(d.ino, b"a")
        assert s.resolve("/b").nlink == 1 and s.read_file("/b") == data(200_000, 2)
        assert s.resolve("/d/a", snap).ino == s.resolve("/b", snap).ino and s.resolve("/b", snap).nlink == 2
        g = s.write_file("/g", b"g")
        s.link(g.ino, d.ino, b"g2")
        s.rename(ROOT_INO, b"b", ROOT_INO, b"g")  # over one name of a linked file
        assert s.resolve("/d/g2").nlink == 1 and s.read_file("/d/g2") == b"g"
        s.unlink(d.ino, b"g2")  # the last name: the inode goes
        s.expire_history()
        s.gc()
        assert s.read_file("/g") == data(200_000, 2)
        assert s.read_file("/d/a", snap) == data(200_000, 2)
    assert_clean(path)


def test_a_link_is_published_as_a_link_event(store_path):
    with Store.open(store_path) as s:
        f = s.write_file("/a", b"12345")
        got = []
        stop = s.events.subscribe(got.append)
        s.link(f.ino, ROOT_INO, b"b")
        s.write_file("/b", b"678")  # a version of the inode: every name of it is told
        stop()
        assert (got[0].kind, got[0].path, got[0].size) == ("link", "/b", 5)
        assert sorted((e.kind, e.path, e.size) for e in got[1:]) == [("version", "/a", 3), ("version", "/b", 3)]
