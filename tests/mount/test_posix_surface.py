"""The POSIX surface through a real mount (format 5): fifos, sockets and device nodes,
atime and ctime, extended attributes, and the set-user-ID / set-group-ID / sticky rules,
as cp -a, rsync -aHX, tar and ln expect them."""
from __future__ import annotations

import errno
import json
import os
import socket
import stat
import struct
import subprocess
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest

from tests.support.mountutil import cowfs, mounted
from tests.support.storeutil import assert_clean

pytestmark = pytest.mark.mount
NOBODY = 65534


def test_fifos_sockets_and_device_nodes(store_path, tmp_path):
    with mounted(store_path, tmp_path / "mnt") as m:
        os.mkfifo(m / "fifo", 0o640)
        os.mknod(m / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
        os.mknod(m / "disk", stat.S_IFBLK | 0o600, os.makedev(8, 1))
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(str(m / "sock"))
        st = {n: os.lstat(m / n) for n in ("fifo", "null", "disk", "sock")}
        assert stat.S_ISFIFO(st["fifo"].st_mode) and stat.S_IMODE(st["fifo"].st_mode) == 0o640
        assert stat.S_ISCHR(st["null"].st_mode) and st["null"].st_rdev == os.makedev(1, 3)
        assert stat.S_ISBLK(st["disk"].st_mode) and os.major(st["disk"].st_rdev) == 8
        assert stat.S_ISSOCK(st["sock"].st_mode)
        got: list[bytes] = []  # the kernel serves a fifo's I/O: it works on the mount
        reader = threading.Thread(target=lambda: got.append((m / "fifo").read_bytes()))
        reader.start()
        (m / "fifo").write_bytes(b"through the pipe")
        reader.join(60)
        assert got == [b"through the pipe"]
        os.mkdir(m / ".snapshots" / "nodes")
        os.rename(m / "fifo", m / "fifo2")
        os.link(m / "null", m / "null2")
        os.unlink(m / "sock")
        assert sorted(os.listdir(m)) == ["disk", "fifo2", "null", "null2"]
        assert os.lstat(m / "null2").st_nlink == 2
        snap = m / ".snapshots" / "nodes"
        assert sorted(os.listdir(snap)) == ["disk", "fifo", "null", "sock"]
        assert stat.S_ISSOCK(os.lstat(snap / "sock").st_mode) and os.lstat(snap / "null").st_rdev == os.makedev(1, 3)
        with pytest.raises(OSError) as e:
            os.mkfifo(snap / "new")
        assert e.value.errno == errno.EROFS
        out = subprocess.run(["tar", "-cf", str(tmp_path / "t.tar"), "-C", str(m), "."], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
    assert_clean(store_path)


def test_atime_and_ctime(store_path, tmp_path):
    with mounted(store_path, tmp_path / "mnt") as m:
        f = m / "f"
        f.write_bytes(b"data")
        os.utime(f, ns=(1_000_000_000_111, 2_000_000_000_222))
        st = os.stat(f)
        assert (st.st_atime_ns, st.st_mtime_ns) == (1_000_000_000_111, 2_000_000_000_222)
        subprocess.run(["touch", "-a", "-d", "@3000", str(f)], check=True)  # atime only: mtime is UTIME_OMIT
        st = os.stat(f)
        assert (st.st_atime_ns, st.st_mtime_ns) == (3_000_000_000_000, 2_000_000_000_222)
        subprocess.run(["touch", "-m", "-d", "@4000", str(f)], check=True)
        st = os.stat(f)
        assert (st.st_atime_ns, st.st_mtime_ns) == (3_000_000_000_000, 4_000_000_000_000)
        f.read_bytes()  # reads do not set atime (noatime-like)
        assert os.stat(f).st_atime_ns == 3_000_000_000_000
        os.utime(f)  # UTIME_NOW for both
        st = os.stat(f)
        assert st.st_atime_ns == st.st_mtime_ns > 4_000_000_000_000
        changes = [lambda: os.chmod(f, 0o600), lambda: os.setxattr(f, "user.k", b"v"),
                   lambda: os.link(f, m / "g"), lambda: os.rename(f, m / "h"), lambda: os.unlink(m / "g"),
                   lambda: os.truncate(m / "h", 1)]
        for change in changes:
            name = "h" if (m / "h").exists() else "f"
            before = os.stat(m / name).st_ctime_ns
            change()
            name = "h" if (m / "h").exists() else "f"
            assert os.stat(m / name).st_ctime_ns > before
    assert_clean(store_path)


def test_open_unlinked_files_long_names_and_ftruncate_times(store_path, tmp_path):
    with mounted(store_path, tmp_path / "mnt") as m:
        fd = os.open(m / "f", os.O_CREAT | os.O_RDWR, 0o644)
        try:
            os.write(fd, b"hello")
            os.unlink(m / "f")
            st = os.fstat(fd)
            assert st.st_nlink == 0 and st.st_size == 5  # no name left, as on ext4
            assert os.pread(fd, 100, 0) == b"hello"
        finally:
            os.close(fd)
        for call in (os.stat, os.unlink, os.rmdir, lambda p: os.chmod(p, 0o600)):
            with pytest.raises(OSError) as e:
                call(m / ("n" * 256))
            assert e.value.errno == errno.ENAMETOOLONG
        (m / "g").write_bytes(b"")
        os.utime(m / "g", ns=(1_000_000_000, 1_000_000_000))
        fd = os.open(m / "g", os.O_RDWR)
        try:
            os.ftruncate(fd, 123)  # the kernel leaves the times of a size change to the file system
            st = os.fstat(fd)
            assert st.st_size == 123 and st.st_mtime_ns > 1_000_000_000 and st.st_ctime_ns >= st.st_mtime_ns
        finally:
            os.close(fd)
        assert os.stat(m / "g").st_mtime_ns > 1_000_000_000
    assert_clean(store_path)


def log(m: Path, path: str) -> list[dict]:
    """`cowfs log`: the versions of every inode ever at `path`, newest first."""
    return json.loads(cowfs("log", str(m), path, "--json").stdout)


def test_a_file_renamed_over_reopens_with_its_version_after_a_prune(store_path, tmp_path):
    """The kernel still has the replaced inode (here: an open descriptor, reopened through
    /proc/self/fd; in general a path looked up but not yet opened): as on ext4 it opens with
    the bytes it had, though a prune ran in between. Once closed, a prune drops its history."""
    with mounted(store_path, tmp_path / "mnt") as m:
        (m / "w.bin").write_bytes(b"old" * 1000)
        fd = os.open(m / "w.bin", os.O_RDONLY)
        try:
            (m / "tmp.bin").write_bytes(b"new" * 1000)
            os.replace(m / "tmp.bin", m / "w.bin")
            cowfs("prune", str(m), "--keep-last", "1")
            assert [v["current"] for v in log(m, "/w.bin")] == [True, False]  # the replaced one kept
            with open(f"/proc/self/fd/{fd}", "rb") as again:
                assert again.read() == b"old" * 1000
            assert os.fstat(fd).st_nlink == 0
        finally:
            os.close(fd)
        assert (m / "w.bin").read_bytes() == b"new" * 1000
        deadline = time.monotonic() + 60  # until the kernel evicts the inode and sends FORGET
        while len(log(m, "/w.bin")) > 1:
            assert time.monotonic() < deadline, "the closed inode's history outlived its FORGET by 60 s"
            cowfs("prune", str(m), "--keep-last", "1")
    assert_clean(store_path)


def test_extended_attributes(store_path, tmp_path):
    with mounted(store_path, tmp_path / "mnt") as m:
        f = m / "model.safetensors"
        f.write_bytes(b"weights")
        assert os.listxattr(f) == []
        os.setxattr(f, "user.step", b"500")
        os.setxattr(f, "user.empty", b"")
        os.setxattr(f, "trusted.origin", b"run1")  # root: CAP_SYS_ADMIN
        assert sorted(os.listxattr(f)) == ["trusted.origin", "user.empty", "user.step"]
        assert os.getxattr(f, "user.step") == b"500" and os.getxattr(f, "user.empty") == b""
        for call, err in [(lambda: os.getxattr(f, "user.none"), errno.ENODATA),
                          (lambda: os.removexattr(f, "user.none"), errno.ENODATA),
                          (lambda: os.setxattr(f, "user.step", b"1", os.XATTR_CREATE), errno.EEXIST),
                          (lambda: os.setxattr(f, "user.new", b"1", os.XATTR_REPLACE), errno.ENODATA),
                          (lambda: os.setxattr(f, "user.big", b"v" * 65537), errno.E2BIG),
                          (lambda: os.setxattr(f, "system.cowfs", b"x"), errno.EOPNOTSUPP)]:
            with pytest.raises(OSError) as e:
                call()
            assert e.value.errno == err
        os.setxattr(f, "user.step", b"600", os.XATTR_REPLACE)
        os.mkdir(m / ".snapshots" / "s")
        os.removexattr(f, "user.step")
        with open(f, "wb") as w:  # a new body keeps the others
            w.write(b"new weights")
        assert sorted(os.listxattr(f)) == ["trusted.origin", "user.empty"]
        snap = m / ".snapshots" / "s" / "model.safetensors"
        assert os.getxattr(snap, "user.step") == b"600" and snap.read_bytes() == b"weights"
        with pytest.raises(OSError) as e:
            os.setxattr(snap, "user.x", b"1")
        assert e.value.errno == errno.EROFS
        os.mkdir(m / "d")
        os.setxattr(m / "d", "user.dir", b"yes")
        assert os.getxattr(m / "d", "user.dir") == b"yes"
        out = subprocess.run(["cp", "-a", "--preserve=all", str(f), str(m / "copy")], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        assert os.getxattr(m / "copy", "trusted.origin") == b"run1"
    assert_clean(store_path)


def test_a_write_drops_a_file_capability(store_path, tmp_path):
    """The kernel asks for security.capability before each write (cowfs answers without a
    query while none is stored) and removes it on a write: after one is set, it must see it."""
    cap = struct.pack("<IIIII", 0x02000000, 1 << 10, 0, 0, 0)  # VFS_CAP_REVISION_2: cap_net_bind_service
    with mounted(store_path, tmp_path / "mnt") as m:
        f = m / "tool"
        f.write_bytes(b"#!/bin/sh\n")
        os.setxattr(f, "security.capability", cap)
        assert os.getxattr(f, "security.capability") == cap
        with open(f, "ab") as w:
            w.write(b"echo\n")
        assert "security.capability" not in os.listxattr(f)
    assert_clean(store_path)


@pytest.fixture
def world_dir() -> Iterator[Path]:
    """A directory other users can reach (pytest's tmp dirs are root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="cowfs-posix-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _as_nobody(fn, *args) -> int:
    """Run fn(*args) in a child process as user and group nobody; its errno, or 0."""
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            fn(*args)
        except OSError as e:
            code = e.errno or 1
        except BaseException:
            code = 255
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _append(path: Path) -> None:
    with open(path, "ab") as f:
        f.write(b"more")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
def test_setuid_setgid_and_sticky_rules(store_path, world_dir):
    with mounted(store_path, world_dir / "mnt", "--allow-other") as m:
        os.chmod(m, 0o777)
        f = m / "prog"
        f.write_bytes(b"x")
        os.chmod(f, 0o6777)  # set-user-ID and set-group-ID (group-executable), writable by all
        assert _as_nobody(_append, f) == 0
        assert stat.S_IMODE(os.stat(f).st_mode) == 0o777  # another user's write clears both
        os.chmod(f, 0o6777)
        _append(f)  # root's write (CAP_FSETID) keeps them
        assert stat.S_IMODE(os.stat(f).st_mode) == 0o6777
        os.chown(f, NOBODY, NOBODY)  # chown clears them
        assert stat.S_IMODE(os.stat(f).st_mode) & 0o6000 == 0
        shared = m / "shared"
        os.mkdir(shared)
        os.chown(shared, 0, 4242)
        os.chmod(shared, 0o2777)
        assert _as_nobody(lambda: (shared / "theirs").write_bytes(b"n")) == 0
        assert _as_nobody(os.mkdir, shared / "sub") == 0
        assert os.stat(shared / "theirs").st_gid == 4242 and os.stat(shared / "sub").st_gid == 4242
        assert os.stat(shared / "sub").st_mode & stat.S_ISGID
        sticky = m / "tmp"
        os.mkdir(sticky)
        os.chmod(sticky, 0o1777)
        (sticky / "roots").write_bytes(b"r")
        assert _as_nobody(os.unlink, sticky / "roots") == errno.EPERM
        assert _as_nobody(os.rename, sticky / "roots", sticky / "mine") == errno.EPERM
        assert _as_nobody(lambda: (sticky / "own").write_bytes(b"o")) == 0
        assert _as_nobody(os.unlink, sticky / "own") == 0
        assert (sticky / "roots").exists()
    assert_clean(store_path)
