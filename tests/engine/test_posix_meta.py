"""The POSIX metadata of the engine (format 5): fifos, sockets and device nodes, atime,
ctime on every change, extended attributes (versioned with the inode), set-group-ID
directories; and what fsck checks of them."""
from __future__ import annotations

import errno
import sqlite3
import stat

import pytest

from cowfs.errors import CowfsError, Exists, InvalidArgument, NoAttribute, NoSpace
from cowfs.store import ROOT_INO, Store
from cowfs.store.catalog.xattrs import CAPABILITY, MAX_TOTAL, VALUE_MAX, XATTR_CREATE, XATTR_REPLACE, decode, encode
from cowfs.store.log.layout import CATALOG_FILE
from tests.support.storeutil import assert_clean, data


def test_special_files_are_kept_renamed_removed_and_snapshotted(store_path):
    with Store.open(store_path) as s:
        fifo = s.mknod(ROOT_INO, b"fifo", stat.S_IFIFO | 0o640)
        sock = s.mknod(ROOT_INO, b"sock", stat.S_IFSOCK | 0o755)
        chr_ = s.mknod(ROOT_INO, b"null", stat.S_IFCHR | 0o666, rdev=(1 << 8) | 3)
        blk = s.mknod(ROOT_INO, b"disk", stat.S_IFBLK | 0o660, rdev=(8 << 8) | 1)
        assert stat.S_ISFIFO(fifo.mode) and stat.S_IMODE(fifo.mode) == 0o640 and fifo.rdev == 0
        assert stat.S_ISSOCK(sock.mode) and stat.S_ISCHR(chr_.mode) and stat.S_ISBLK(blk.mode)
        assert (chr_.rdev, blk.rdev, chr_.size, chr_.nlink) == ((1 << 8) | 3, (8 << 8) | 1, 0, 1)
        assert not fifo.is_file and not fifo.is_dir and not fifo.is_symlink
        with pytest.raises(InvalidArgument):
            s.mknod(ROOT_INO, b"dir", stat.S_IFDIR | 0o755)  # mkdir makes directories
        with pytest.raises(Exists):
            s.mknod(ROOT_INO, b"fifo", stat.S_IFIFO | 0o644)
        snap = s.snapshot_create("nodes").gen
        s.rename(ROOT_INO, b"fifo", ROOT_INO, b"fifo2")
        s.link(chr_.ino, ROOT_INO, b"null2")
        s.unlink(ROOT_INO, b"sock")
        names = {n: a for n, a in s.readdir(ROOT_INO)}
        assert set(names) == {b"fifo2", b"null", b"null2", b"disk"} and names[b"null2"].nlink == 2
        old = {n: a for n, a in s.readdir(ROOT_INO, snap)}
        assert set(old) == {b"fifo", b"sock", b"null", b"disk"} and stat.S_ISSOCK(old[b"sock"].mode)
        assert old[b"null"].rdev == (1 << 8) | 3
    assert_clean(store_path)


def test_atime_is_stored_and_set_without_touching_mtime(store_path):
    with Store.open(store_path) as s:
        f = s.write_file("/f", b"x")
        assert f.atime_ns == s.resolve("/f").atime_ns > 0
        a = s.setattr(f.ino, atime_ns=1_000_000_123)
        assert (a.atime_ns, a.mtime_ns) == (1_000_000_123, f.mtime_ns) and a.ctime_ns >= f.ctime_ns
        b = s.setattr(f.ino, mtime_ns=2_000_000_456)
        assert (b.atime_ns, b.mtime_ns) == (1_000_000_123, 2_000_000_456)
        s.write_file("/f", b"yz")  # a new body keeps the atime (reads and writes do not set it)
        assert s.resolve("/f").atime_ns == 1_000_000_123


def _ctime(s: Store, path: str) -> int:
    return s.resolve(path).ctime_ns


def test_ctime_moves_on_every_change(store_path):
    with Store.open(store_path) as s:
        s.mkdir(ROOT_INO, b"d")
        f = s.write_file("/d/f", b"1")
        steps = [
            lambda: s.setattr(f.ino, mode=0o600),
            lambda: s.setattr(f.ino, uid=1234),
            lambda: s.setattr(f.ino, gid=4321),
            lambda: s.setattr(f.ino, mtime_ns=5),
            lambda: s.setattr(f.ino, atime_ns=5),
            lambda: s.setattr(f.ino, size=0),
            lambda: s.write_file("/d/f", b"22"),
            lambda: s.setxattr(f.ino, b"user.a", b"1"),
            lambda: s.removexattr(f.ino, b"user.a"),
            lambda: s.link(f.ino, ROOT_INO, b"g"),
            lambda: s.rename(s.resolve("/d").ino, b"f", ROOT_INO, b"h"),
            lambda: s.unlink(ROOT_INO, b"g"),
        ]
        for step in steps:
            before = s.getattr(f.ino).ctime_ns
            step()
            assert s.getattr(f.ino).ctime_ns > before, step
        renamed_before = _ctime(s, "/d")
        s.rename(ROOT_INO, b"d", ROOT_INO, b"e")  # a moved directory's ctime too (as ext4)
        assert _ctime(s, "/e") > renamed_before


def test_a_rename_is_not_a_new_version_in_history(store_path):
    with Store.open(store_path) as s:
        for i in range(3):
            s.write_file("/tmp", data(10_000, i))
            s.rename(ROOT_INO, b"tmp", ROOT_INO, b"model")
            s.setattr(s.resolve("/model").ino, mode=0o600)  # metadata: the same version
        hist = s.history("/model")
        assert [v.size for v in hist] == [10_000] * 3 and hist[0].death_gen is None
        assert all(v.death_gen is not None for v in hist[1:])


def test_xattrs_get_set_list_remove_with_linux_errors(store_path):
    with Store.open(store_path) as s:
        f = s.write_file("/f", b"x").ino
        assert s.listxattr(f) == []
        with pytest.raises(NoAttribute) as e:
            s.getxattr(f, b"user.none")
        assert e.value.errno == errno.ENODATA
        s.setxattr(f, b"user.b", b"2")
        s.setxattr(f, b"user.a", b"")
        s.setxattr(f, b"trusted.t", bytes(range(256)))
        s.setxattr(f, b"security.selinux", b"system_u:object_r:tmp_t:s0\0")
        assert s.listxattr(f) == [b"security.selinux", b"trusted.t", b"user.a", b"user.b"]
        assert s.getxattr(f, b"trusted.t") == bytes(range(256)) and s.getxattr(f, b"user.a") == b""
        with pytest.raises(Exists):
            s.setxattr(f, b"user.a", b"x", XATTR_CREATE)
        with pytest.raises(NoAttribute):
            s.setxattr(f, b"user.c", b"x", XATTR_REPLACE)
        s.setxattr(f, b"user.a", b"replaced", XATTR_REPLACE)
        s.setxattr(f, b"user.c", b"created", XATTR_CREATE)
        for name, err in [(b"system.posix_acl_access", errno.EOPNOTSUPP), (b"user.", errno.EOPNOTSUPP),
                          (b"other.x", errno.EOPNOTSUPP), (b"user." + b"n" * 251, errno.ERANGE)]:
            with pytest.raises(CowfsError) as e:
                s.setxattr(f, name, b"v")
            assert e.value.errno == err, name
        with pytest.raises(CowfsError) as e:
            s.setxattr(f, b"user.big", b"v" * (VALUE_MAX + 1))
        assert e.value.errno == errno.E2BIG
        s.setxattr(f, b"user.big", b"v" * VALUE_MAX)  # the largest value Linux passes
        with pytest.raises(NoSpace):
            s.setxattr(f, b"user.big2", b"v" * VALUE_MAX)  # over the per-inode total
        s.removexattr(f, b"user.big")
        with pytest.raises(NoAttribute):
            s.removexattr(f, b"user.big")
        d = s.mkdir(ROOT_INO, b"d").ino
        s.setxattr(d, b"user.dir", b"yes")
        assert s.getxattr(d, b"user.dir") == b"yes"
    assert_clean(store_path)


def test_xattrs_are_versioned_with_the_inode_and_survive_new_bodies(store_path):
    with Store.open(store_path) as s:
        f = s.write_file("/f", data(50_000, 1)).ino
        s.setxattr(f, b"user.step", b"100")
        snap = s.snapshot_create("at-100").gen
        s.setxattr(f, b"user.step", b"200")
        s.write_file("/f", data(50_000, 2))  # a commit keeps the attributes
        s.setattr(f, mode=0o600)
        assert s.getxattr(f, b"user.step") == b"200"
        assert s.getxattr(f, b"user.step", snap) == b"100"
        s.removexattr(f, b"user.step")
        assert s.listxattr(f) == [] and s.listxattr(f, snap) == [b"user.step"]
    with Store.open(store_path) as s:  # and after a reopen
        assert s.getxattr(s.resolve("/f").ino, b"user.step", s.snapshot("at-100").gen) == b"100"


def test_the_capability_fast_answer_follows_what_is_stored(store_path):
    with Store.open(store_path) as s:
        f = s.write_file("/f", b"x").ino
        assert not s.may_have_xattr(CAPABILITY) and s.may_have_xattr(b"user.a")
        s.setxattr(f, CAPABILITY, b"\x01\x00\x00\x02")
        assert s.may_have_xattr(CAPABILITY)
        s.removexattr(f, CAPABILITY)
    with Store.open(store_path) as s:  # history still holds a version with it
        assert s.may_have_xattr(CAPABILITY)


def test_xattr_encoding_round_trips_and_rejects_truncation():
    attrs = {b"user.a": b"", b"user.b" * 40: bytes(300), b"trusted.z": b"\0\xff"}
    blob = encode(attrs)
    assert decode(blob) == attrs and encode({}) is None and decode(None) == {}
    for cut in (1, 3, len(blob) - 1):
        with pytest.raises(ValueError):
            decode(blob[:cut])
    assert len(encode({b"user.x": b"v" * 10})) == 1 + 6 + 4 + 10
    assert MAX_TOTAL >= VALUE_MAX + 260


def test_setgid_directories_pass_their_group_on(store_path):
    with Store.open(store_path) as s:
        d = s.mkdir(ROOT_INO, b"shared", 0o2775, uid=0, gid=777)
        f = s.create(d.ino, b"f", 0o644, uid=1000, gid=1000)
        sub = s.mkdir(d.ino, b"sub", 0o755, uid=1000, gid=1000)
        node = s.mknod(d.ino, b"p", stat.S_IFIFO | 0o644, uid=1000, gid=1000)
        assert (f.gid, sub.gid, node.gid) == (777, 777, 777)
        assert sub.mode & stat.S_ISGID and not f.mode & stat.S_ISGID
        plain = s.mkdir(ROOT_INO, b"plain", 0o755, uid=0, gid=0)
        g = s.create(plain.ino, b"g", 0o644, uid=1000, gid=1000)
        assert g.gid == 1000


def test_fsck_names_bad_xattrs_and_kind_mismatches(store_path):
    with Store.open(store_path) as s:
        f = s.write_file("/f", b"x").ino
        p = s.mknod(ROOT_INO, b"p", stat.S_IFIFO | 0o644).ino
    conn = sqlite3.connect(store_path / CATALOG_FILE)
    conn.execute("UPDATE versions SET xattrs = X'0575736572' WHERE ino = ?", (f,))  # a name cut short
    conn.execute("UPDATE versions SET mode = ? WHERE ino = ?", (stat.S_IFREG | 0o644, p))
    conn.commit()
    conn.close()
    with Store.open(store_path) as s:
        lines = [problem.line() for problem in s.fsck().problems]
    assert any("extended attributes do not decode" in line for line in lines), lines
    assert any(f"of inode {p} (kind 4)" in line for line in lines), lines
    conn = sqlite3.connect(store_path / CATALOG_FILE)  # put it back for the fixture's fsck
    conn.execute("UPDATE versions SET xattrs = NULL WHERE ino = ?", (f,))
    conn.execute("UPDATE versions SET mode = ? WHERE ino = ?", (stat.S_IFIFO | 0o644, p))
    conn.commit()
    conn.close()
