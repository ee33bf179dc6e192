"""Gets (issue 34): a file's committed bytes handed over by the daemon in a sealed memfd, with
no FUSE READs (cowfs/fs/get_op.py, cowfs/plugins/get.py): the bytes a read through the mount
gives, for live files, snapshots and compacted (delta-coded) versions; a damaged chunk gives
EIO and is logged; the kernel's open checks guard it."""
from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import stat
from pathlib import Path

import pytest
import torch

import cowfs
from cowfs.plugins.get import open_read
from tests.mount.test_compact_mount import write_checkpoints
from tests.mount.test_put import NOBODY, _as_nobody
from tests.support.mountutil import cowfs as cowfs_cli
from tests.support.mountutil import mounted, new_store
from tests.support.storeutil import damage_middle_chunk
from tools.harnessutil import sha_file

pytestmark = pytest.mark.mount


def _via_get(path: Path) -> bytes:
    with open_read(path) as f:
        st = os.fstat(f.fileno())
        assert not stat.S_ISREG(st.st_mode) or st.st_dev != os.stat(path).st_dev, "read through the mount"
        seals = fcntl.fcntl(f.fileno(), fcntl.F_GET_SEALS)
        assert seals & fcntl.F_SEAL_WRITE and seals & fcntl.F_SEAL_SHRINK
        return f.read()


def test_get_gives_what_a_read_gives(store_path: Path, tmp_path: Path) -> None:
    big = os.urandom(21 << 20) + bytes(3 << 20) + os.urandom(12345)  # several spans, zeros, a ragged end
    with mounted(store_path, tmp_path / "m") as mnt:
        (mnt / "big").write_bytes(big)
        (mnt / "empty").write_bytes(b"")
        (mnt / "small").write_bytes(b"abc")
        with open(mnt / "sparse", "wb") as f:
            f.truncate(9 << 20)
            f.seek(5 << 20)
            f.write(b"x" * 100_000)
        assert _via_get(mnt / "big") == big
        assert _via_get(mnt / "empty") == b""
        assert _via_get(mnt / "small") == b"abc"
        assert _via_get(mnt / "sparse") == (mnt / "sparse").read_bytes()
        cowfs_cli("snapshot", "create", str(mnt), "s1")
        (mnt / "small").write_bytes(b"changed")
        assert _via_get(mnt / ".snapshots" / "s1" / "small") == b"abc"
        # a writer's uncommitted bytes: a get, like an open for reading, gives the committed version
        with open(mnt / "small", "r+b") as w:
            w.write(b"UNCOMMITTED")
            w.flush()
            assert _via_get(mnt / "small") == b"changed"
        assert _via_get(mnt / "small") == b"UNCOMMITTED"
        state = {"w": torch.randn(300, 300), "step": 3}
        cowfs.save(state, mnt / "s.pt")
        for kwargs in ({}, {"mmap": True}, {"mmap": False}):  # mmap: torch maps the memfd itself; False: kept
            back = cowfs.load(mnt / "s.pt", weights_only=True, **kwargs)
            assert torch.equal(back["w"], state["w"]) and back["step"] == 3


def test_a_kept_get_fills_a_memfd_of_the_process_and_gives_it_back(store_path: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """open_read(kept=True) (DCP's reader): the daemon fills one of the process's kept memfds,
    the file object reads only this file's bytes of it, and its close gives it back for the
    next get, which takes the smallest that holds its bytes."""
    from cowfs.plugins.part_memfds import PartMemfds

    memfds = PartMemfds(keep=64 << 20)
    monkeypatch.setattr("cowfs.plugins.get.part_memfds", lambda: memfds)
    big = os.urandom(21 << 20) + bytes(3 << 20) + os.urandom(12345)
    with mounted(store_path, tmp_path / "m") as mnt:
        (mnt / "big").write_bytes(big)
        (mnt / "small").write_bytes(b"abcdef")
        (mnt / "empty").write_bytes(b"")
        with open_read(mnt / "big", kept=True) as f:
            memfd = os.fstat(f.fileno())
            assert stat.S_ISREG(memfd.st_mode) and memfd.st_dev != os.stat(mnt).st_dev
            assert f.read() == big and memfds.free == 0
        assert memfds.free == 1
        with open_read(mnt / "small", kept=True) as f:  # the same memfd, 24 MiB of older bytes in it
            assert os.fstat(f.fileno()).st_ino == memfd.st_ino
            assert f.read(2) == b"ab" and f.seek(-1, os.SEEK_END) == 5 and f.read() == b"f" and f.read() == b""
            f.seek(1)
            buf = bytearray(10)
            assert f.readinto(buf) == 5 and bytes(buf[:5]) == b"bcdef"
        with open_read(mnt / "empty", kept=True) as f:
            assert f.read() == b""
        assert memfds.free == 1 and memfds.owned == len(big)
        memfds.set_keep(0)  # nothing kept: a get as before, in a memfd the daemon made and sealed
        assert _via_get(mnt / "small") == b"abcdef"
        with open_read(mnt / "small", kept=True) as f:
            assert fcntl.fcntl(f.fileno(), fcntl.F_GET_SEALS) & fcntl.F_SEAL_WRITE and f.read() == b"abcdef"
        assert memfds.owned == 0


def test_get_of_compacted_versions(store_path: Path, tmp_path: Path) -> None:
    with mounted(store_path, tmp_path / "m") as mnt:
        shas = write_checkpoints(mnt, 4)
        cowfs_cli("compact", str(mnt))
        stats = cowfs_cli("stats", "--json", str(mnt)).stdout
        assert b'"uncompacted_bodies": 0' in stats
        for path, (sha, _size) in shas.items():
            with open_read(path) as f:
                assert hashlib.sha256(f.read()).hexdigest() == sha, path
            assert sha_file(path)[0] == sha


def test_get_of_a_damaged_chunk_is_eio(tmp_path: Path) -> None:
    store_path = new_store(tmp_path / "store", segment_size=16 << 20)  # (damaged: not the fsck'ed fixture)
    data = os.urandom(6 << 20)
    with mounted(store_path, tmp_path / "m") as mnt:
        (mnt / "f").write_bytes(data)
        (mnt / "ok").write_bytes(b"fine")
    damage_middle_chunk(store_path, "/f")
    with mounted(store_path, tmp_path / "m") as mnt:
        with pytest.raises(OSError) as err:
            _via_get(mnt / "f")
        assert err.value.errno == errno.EIO and "damaged" in str(err.value)
        with pytest.raises(OSError) as err:  # into a kept memfd too
            open_read(mnt / "f", kept=True)
        assert err.value.errno == errno.EIO
        assert _via_get(mnt / "ok") == b"fine"
        with open(mnt / "f", "rb") as f:  # a read through the mount far from the damage still works
            assert f.read(4096) == data[:4096]
    assert "corrupt data: /f" in (store_path / "cowfs.log").read_text()
    assert b"/f" in cowfs_cli("fsck", str(store_path), check=False).stdout


def test_get_needs_a_readable_open(store_path: Path, tmp_path: Path) -> None:
    with mounted(store_path, tmp_path / "m", "--allow-other") as mnt:
        os.chmod(mnt, 0o755)
        (mnt / "private").write_bytes(b"secret")
        os.chmod(mnt / "private", 0o600)

        def read_private(root: Path) -> None:
            if _via_get(root / "private") != b"secret":
                raise OSError(errno.EBADMSG, "wrong bytes")

        assert NOBODY != os.getuid()
        assert _as_nobody(mnt, read_private) == errno.EACCES  # the kernel refuses the open
        os.chmod(mnt / "private", 0o644)
        assert _as_nobody(mnt, read_private) == 0
