"""Mount lifecycle and basic POSIX semantics through a real mount."""
from __future__ import annotations

import errno
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from cowfs.mountinfo import process_alive
from cowfs.store import Store

from tests.support.mountutil import cowfs, daemon_pid, kill9, mounted, read_ahead_kib
from tests.support.storeutil import assert_clean, data, new_store

pytestmark = pytest.mark.mount


def test_mount_errors_are_one_line_exit_2(store_path, tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    cases = [
        (("mount", str(tmp_path / "nostore"), str(tmp_path)), "no such directory"),
        (("mount", str(store_path), str(tmp_path / "missing")), "does not exist"),
        (("mount", str(store_path), str(tmp_path / "full")), "not empty"),
    ]
    for args, msg in cases:
        r = cowfs(*args, check=False)
        assert r.returncode == 2 and msg in r.stderr.decode() and r.stderr.decode().count("\n") == 1, r.stderr
    with mounted(store_path, tmp_path / "m1"):
        (tmp_path / "m2").mkdir()
        r = cowfs("mount", str(store_path), str(tmp_path / "m2"), check=False)
        assert r.returncode == 2 and "already mounted" in r.stderr.decode()
    r = cowfs("umount", str(tmp_path / "m1"), check=False)
    assert r.returncode == 2 and "no cowfs filesystem" in r.stderr.decode()


def test_posix_semantics(store_path, tmp_path):
    with mounted(store_path, tmp_path / "mnt") as m:
        (m / "d").mkdir()
        with open(m / "d" / "f", "wb") as f:
            f.write(b"hello")
        st = os.stat(m / "d" / "f")
        assert st.st_size == 5 and st.st_nlink == 1
        dir_mtime = os.stat(m / "d").st_mtime_ns
        os.rename(m / "d" / "f", m / "d" / "g")
        assert os.stat(m / "d").st_mtime_ns >= dir_mtime
        with pytest.raises(OSError) as e:
            os.rmdir(m / "d")
        assert e.value.errno == errno.ENOTEMPTY
        os.symlink("g", m / "d" / "last")
        assert os.readlink(m / "d" / "last") == "g" and (m / "d" / "last").read_bytes() == b"hello"
        os.chmod(m / "d" / "g", 0o600)
        os.utime(m / "d" / "g", ns=(1, 2_000_000_000))
        st = os.stat(m / "d" / "g")
        assert st.st_mode & 0o777 == 0o600 and st.st_mtime_ns == 2_000_000_000
        with open(m / "d" / "g", "r+b") as f:
            f.truncate(2)
            f.seek(10)
            f.write(b"x")
        assert (m / "d" / "g").read_bytes() == b"he" + bytes(8) + b"x"
        fd = os.open(m / "d" / "g", os.O_RDWR)
        os.posix_fallocate(fd, 0, 100)
        os.close(fd)
        assert os.stat(m / "d" / "g").st_size == 100
        st = os.statvfs(m)
        assert st.f_blocks > 0
        assert sorted(os.listdir(m)) == ["d"]  # .snapshots is not listed ...
        assert os.path.isdir(m / ".snapshots")  # ... but can be entered
        os.mkdir(m / ".snapshots" / "one")
        assert os.listdir(m / ".snapshots") == ["one"]
        for op in (lambda: open(m / ".snapshots" / "one" / "d" / "g", "wb"),
                   lambda: os.mkdir(m / ".snapshots" / "one" / "x"),
                   lambda: os.rename(m / ".snapshots" / "one" / "d" / "g", m / ".snapshots" / "one" / "d" / "h"),
                   lambda: os.unlink(m / ".snapshots" / "one" / "d" / "g")):
            with pytest.raises(OSError) as e:
                op()
            assert e.value.errno == errno.EROFS
        os.unlink(m / "d" / "last")
        os.unlink(m / "d" / "g")
        os.rmdir(m / "d")
        assert (m / ".snapshots" / "one" / "d" / "g").read_bytes()[:2] == b"he"
        os.rmdir(m / ".snapshots" / "one")
        assert os.listdir(m / ".snapshots") == []


def test_close_commits_and_survives_remount(store_path, tmp_path):
    blob = data(5_000_000, 1)
    with mounted(store_path, tmp_path / "mnt") as m:
        (m / "a.bin").write_bytes(blob)
        (m / "b.bin").write_bytes(blob)  # dedups with a.bin
    with Store.open(store_path) as s:
        st = s.stats()
        assert st["stored_bytes"] == len(blob) and st["logical_bytes"] == 2 * len(blob)
    with mounted(store_path, tmp_path / "mnt") as m:
        assert (m / "a.bin").read_bytes() == blob and (m / "b.bin").read_bytes() == blob


def test_kill9_mid_write_leaves_previous_version(store_path, tmp_path):
    old, new = data(3_000_000, 1), data(6_000_000, 2)
    mnt = tmp_path / "mnt"
    with mounted(store_path, mnt) as m:
        (m / "model.pt").write_bytes(old)
        f = open(m / "model.pt", "wb")  # O_TRUNC, like torch.save
        f.write(new[:4_000_000])
        f.flush()
        kill9(store_path, mnt)
        try:
            f.close()
        except OSError:
            pass
    with mounted(store_path, mnt) as m:
        assert (m / "model.pt").read_bytes() == old


def test_kill9_between_rename_and_close_keeps_previous_version(store_path, tmp_path):
    """safetensors 0.8 save_file over an existing file: open tmp, write, rename over, close.
    A crash between the rename and the close must leave the previous version, not an empty file."""
    a, b = data(3_000_000, 1), data(3_000_000, 2)
    mnt = tmp_path / "mnt"
    with mounted(store_path, mnt) as m:
        p = m / "model.safetensors"
        p.write_bytes(a)
        tmpf = m / ".tmpAbC123"
        fd = os.open(tmpf, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        os.ftruncate(fd, len(b))
        os.write(fd, b)
        os.rename(tmpf, p)
        kill9(store_path, mnt)
        try:
            os.close(fd)
        except OSError:
            pass
    with mounted(store_path, mnt) as m:
        assert (m / "model.safetensors").read_bytes() in (a, b)
        assert os.listdir(m) == ["model.safetensors"]


def test_paths_with_commas_and_backslashes_mount(tmp_path):
    """libfuse splits mount options at commas; the store path goes into one (fsname)."""
    base = tmp_path / "runs,2026\\x"
    base.mkdir()
    store_path = new_store(base / "store,a", segment_size=16 << 20)
    with mounted(store_path, base / "mnt,a") as m:
        (m / "model.pt").write_bytes(b"weights")
        assert cowfs("cat", str(m), "/model.pt").stdout == b"weights"  # the mountpoint maps back to the store
    assert_clean(store_path)


@pytest.mark.parametrize("extra", [(), ("--writeback-cache",)])
def test_read_ahead_raised_with_and_without_the_writeback_cache(store_path, tmp_path, extra):
    from cowfs.fs.mount import READ_AHEAD_KIB

    with mounted(store_path, tmp_path / "mnt", *extra) as m:
        (m / "model.pt").write_bytes(data(3_000_000, 5))
        assert (m / "model.pt").read_bytes() == data(3_000_000, 5)
        deadline = time.monotonic() + 10  # set by the daemon once the kernel has its INIT reply
        while read_ahead_kib(m) != READ_AHEAD_KIB and time.monotonic() < deadline:
            time.sleep(0.05)
        assert read_ahead_kib(m) == READ_AHEAD_KIB


def test_cp_writes_in_the_preferred_io_size_the_mount_reports(store_path, tmp_path):
    """st_blksize is 4 MiB, so cp writes in 4 MiB pieces (each write(2) is at least one FUSE
    request), and what it copied reads back whole."""
    from cowfs.fs.attrs import PREFERRED_IO

    src = tmp_path / "src.bin"
    src.write_bytes(data(5_000_000, 9))
    with mounted(store_path, tmp_path / "mnt") as m:
        (m / "empty").write_bytes(b"")
        assert os.stat(m / "empty").st_blksize == PREFERRED_IO == 4 << 20
        trace = tmp_path / "cp.strace"
        subprocess.run(["strace", "-f", "-e", "trace=write", "-o", str(trace), "cp", str(src), str(m / "copy.bin")],
                       check=True)
        sizes = [int(line.rsplit("=", 1)[1]) for line in trace.read_text().splitlines()
                 if line.split(None, 1)[1].startswith("write(") and "=" in line]
        assert sizes and max(sizes) == PREFERRED_IO and sum(sizes) == 5_000_000
        assert (m / "copy.bin").read_bytes() == data(5_000_000, 9)
    assert_clean(store_path)


def test_writes_reach_the_daemon_by_splice_under_the_systems_pipe_limit(store_path, tmp_path):
    """libfuse splices a request only into a pipe that holds the largest one and its header:
    under a limit too small for libfuse's 1 MiB requests, the mount asks for smaller ones, and
    the daemon's log says so; the system-wide setting stays as it was."""
    import signal
    import threading

    from cowfs.fs.write_requests import LIBFUSE_LARGEST, libfuse_splices, spliced_max_write

    limit = int(Path("/proc/sys/fs/pipe-max-size").read_text())
    max_write = spliced_max_write()
    trace = tmp_path / "daemon.strace"
    with mounted(store_path, tmp_path / "mnt") as m:
        tracer = subprocess.Popen(["strace", "-f", "-e", "trace=splice,read", "-o", str(trace),
                                   "-p", str(daemon_pid(store_path))], stderr=subprocess.PIPE, text=True)
        try:
            attached = threading.Event()  # strace says so on stderr once it traces every thread

            def watch() -> None:
                for line in tracer.stderr:  # type: ignore[union-attr]
                    if "attached" in line:
                        attached.set()

            threading.Thread(target=watch, daemon=True).start()
            assert attached.wait(60), "strace did not attach to the daemon"
            (m / "f").write_bytes(data(4 << 20, 3))  # one write(2) of 4 MiB
        finally:
            tracer.send_signal(signal.SIGINT)
            tracer.wait(timeout=60)
        assert (m / "f").read_bytes() == data(4 << 20, 3)
    largest = {"splice": 0, "read": 0}
    for line in trace.read_text().splitlines():  # "PID splice(...) = N", or, where strace split
        call = line.split(None, 1)[1] if " " in line else ""  # a call between threads, its
        if call.startswith("<... "):  # second half "PID <... splice resumed>...) = N"
            call = call[5:]
        name = re.match(r"\w+", call)
        if name and name[0] in largest and (ret := re.findall(r"\) += (\d+)", call)):
            largest[name[0]] = max(largest[name[0]], int(ret[-1]))  # the last: the bytes it read may hold ") = "
    logged = (store_path / "cowfs.log").read_text()
    if max_write:  # the default limit (1 MiB) and no CAP_SYS_RESOURCE: requests one page short of the pipe
        assert "WRITE requests of at most %d KiB" % (max_write >> 10) in logged
        assert LIBFUSE_LARGEST > largest["splice"] > max_write and largest["read"] < LIBFUSE_LARGEST
    elif libfuse_splices():  # libfuse's own 1 MiB requests fit the pipes this daemon may make
        assert largest["splice"] > LIBFUSE_LARGEST
    else:  # a limit below 132 KiB: no splice, and the log says what would give it
        assert "writes reach cowfs without splice" in logged
    assert int(Path("/proc/sys/fs/pipe-max-size").read_text()) == limit


def test_writeback_cache_is_off_unless_asked() -> None:
    from cowfs.cli import build_parser
    from cowfs.fs.operations import CowfsOperations

    assert CowfsOperations.enable_writeback_cache is False
    assert build_parser().parse_args(["mount", "s", "m"]).writeback_cache is None  # the operations' default: off
    assert build_parser().parse_args(["mount", "s", "m", "--writeback-cache"]).writeback_cache is True
    assert build_parser().parse_args(["mount", "s", "m", "--no-writeback-cache"]).writeback_cache is False


def test_process_alive_counts_a_zombie_as_exited():
    """umount and the harnesses wait for a daemon with it: an exited, unreaped child is gone."""
    p = subprocess.Popen(["sleep", "30"])
    try:
        assert process_alive(p.pid)
        p.kill()
        deadline = time.monotonic() + 10
        while process_alive(p.pid) and time.monotonic() < deadline:  # not reaped: a zombie
            time.sleep(0.01)
        assert not process_alive(p.pid)
    finally:
        p.kill()
        p.wait()
    assert not process_alive(p.pid)


def _synced_ns(store_path):
    """meta.synced_ns of a (mounted) store's catalog: set only by a durability barrier."""
    import sqlite3

    conn = sqlite3.connect(f"file:{store_path / 'catalog.db'}?mode=ro", uri=True)
    try:
        row = conn.execute("SELECT value FROM meta WHERE key = 'synced_ns'").fetchone()
    finally:
        conn.close()
    return row[0] if row else None


def test_a_created_file_is_durable_at_close_without_a_fsync_of_its_own(store_path, tmp_path):
    """A create through the mount skips the WAL fsync: a file written and closed needs no
    barrier (its version's commit fsyncs the create with it); a file closed empty gets one
    at its close."""
    with mounted(store_path, tmp_path / "mnt") as m:
        (m / "written").write_bytes(b"x" * 5000)
        assert _synced_ns(store_path) is None  # the version's durable commit covered the create
        (m / "empty").touch()
        first = _synced_ns(store_path)
        assert first is not None  # its FLUSH made the create durable
        with open(m / "written", "ab") as f:  # an open of an existing file: no barrier
            f.write(b"y")
        assert _synced_ns(store_path) == first
    with Store.open(store_path) as s:
        assert s.read_file("/written") == b"x" * 5000 + b"y" and s.read_file("/empty") == b""
    assert_clean(store_path)


def test_hard_links(store_path, tmp_path):
    """ln, cp -al and rsync -H need link(): one inode, several names, the same versions
    through each; unlink of one name keeps the others; snapshots keep the links."""
    with mounted(store_path, tmp_path / "mnt") as m:
        (m / "run").mkdir()
        (m / "run" / "ckpt.pt").write_bytes(b"v1")
        os.link(m / "run" / "ckpt.pt", m / "best.pt")  # across directories
        a, b = os.stat(m / "run" / "ckpt.pt"), os.stat(m / "best.pt")
        assert a.st_ino == b.st_ino and a.st_nlink == b.st_nlink == 2
        with open(m / "best.pt", "r+b") as f:  # a new version through one name ...
            f.write(b"V2")
        assert (m / "run" / "ckpt.pt").read_bytes() == b"V2"  # ... is the other's too
        os.mkdir(m / ".snapshots" / "s")
        with pytest.raises(FileExistsError):
            os.link(m / "best.pt", m / "run" / "ckpt.pt")
        with pytest.raises(PermissionError):
            os.link(m / "run", m / "run2")  # never a directory
        os.rename(m / "best.pt", m / "run" / "ckpt.pt")  # two names of one inode: nothing happens
        assert sorted(os.listdir(m)) == ["best.pt", "run"]
        os.unlink(m / "run" / "ckpt.pt")
        assert (m / "best.pt").read_bytes() == b"V2" and os.stat(m / "best.pt").st_nlink == 1
        (m / "other").write_bytes(b"o")
        os.link(m / "other", m / "other2")
        os.rename(m / "best.pt", m / "other")  # over one name of a linked file: the other keeps it
        assert (m / "other2").read_bytes() == b"o" and os.stat(m / "other2").st_nlink == 1
        snap = m / ".snapshots" / "s"
        assert os.stat(snap / "best.pt").st_ino == os.stat(snap / "run" / "ckpt.pt").st_ino
        assert os.stat(snap / "best.pt").st_nlink == 2 and (snap / "best.pt").read_bytes() == b"V2"
    assert_clean(store_path)
