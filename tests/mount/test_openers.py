"""fs/openers.py: who holds a file open for writing, read from /proc/PID/fdinfo (the FLUSH
check that tells a writer's close from the close of a descriptor copy)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from cowfs.fs.openers import fd_info, holds_writable


def _mnt_id(fd: int) -> int:
    info = Path(f"/proc/self/fdinfo/{fd}").read_text()
    return int(info.split("mnt_id:\t")[1].split()[0])


def test_a_writable_descriptor_is_found_by_mount_and_inode(tmp_path: Path) -> None:
    path = tmp_path / "f"
    other = tmp_path / "other"  # a file of the same mount that this process holds no descriptor on
    other.write_bytes(b"")     # (not ino + 1: pytest's own capture files may have that inode)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        mnt, ino = _mnt_id(fd), os.fstat(fd).st_ino
        assert holds_writable(os.getpid(), mnt, ino)
        assert not holds_writable(os.getpid(), mnt, other.stat().st_ino)
        assert not holds_writable(os.getpid(), mnt + 100000, ino)
    finally:
        os.close(fd)
    assert not holds_writable(os.getpid(), mnt, ino)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert not holds_writable(os.getpid(), mnt, ino)  # read-only does not count
    finally:
        os.close(fd)
    fd = os.open(path, os.O_RDWR)
    try:
        assert holds_writable(os.getpid(), mnt, ino)
    finally:
        os.close(fd)


def test_another_process_and_a_gone_one(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"")
    child = subprocess.Popen([sys.executable, "-c", "import sys; f = open(sys.argv[1], 'ab'); print(f.fileno(), flush=True);"
                              " sys.stdin.read()", str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdin is not None
        int(child.stdout.readline())  # the file is open in the child now
        fd = os.open(path, os.O_RDONLY)
        mnt, ino = _mnt_id(fd), os.fstat(fd).st_ino
        os.close(fd)
        assert holds_writable(child.pid, mnt, ino)
        child.stdin.close()
        child.wait(timeout=60)
        assert not holds_writable(child.pid, mnt, ino)  # gone
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_fd_info_reads_flags_mount_and_inode_without_the_file(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        info = fd_info(os.getpid(), fd)
        assert info is not None
        flags, mnt, ino = info
        assert flags & os.O_ACCMODE == os.O_WRONLY and flags & os.O_APPEND
        assert (mnt, ino) == (_mnt_id(fd), os.fstat(fd).st_ino)
    finally:
        os.close(fd)
    assert fd_info(os.getpid(), fd) is None  # closed
    assert fd_info(2**22 + 7, 0) is None  # no such process
