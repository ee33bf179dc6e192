"""Puts (issue 34): a file's bytes handed to the daemon in a sealed memfd, committed as one
durable version without FUSE WRITEs (cowfs/fs/put_server.py, cowfs/plugins/put.py): the same
result as a save through the mount; the kernel's open checks guard it; bad requests change
nothing."""
from __future__ import annotations

import encodings.unicode_escape  # noqa: F401 - imported before a child drops to nobody (mountinfo uses it)
import errno
import fcntl
import json
import os
import socket
from pathlib import Path

import pytest
import torch

import cowfs
from cowfs.plugins.put import PutRefused, PutStream, put
from cowfs.protocol import bulk_socket_name
from cowfs.store import Store
from tests.support.mountutil import cowfs as cowfs_cli
from tests.support.mountutil import mounted, small_fs
from tests.support.storeutil import assert_clean, fill

NOBODY = 65534


def _chunks(store: Path, name: str) -> list[tuple[int, int, bytes]]:
    with Store.open(store) as s:
        ino = s.resolve("/" + name).ino
        with s.open_reader(ino) as r:
            return [(e.offset, e.length, e.chunk) for e in r.extents]


def test_save_commits_what_a_save_through_the_mount_commits(store_path: Path, tmp_path: Path) -> None:
    state = {f"w{i}": torch.randn(256, 1024) for i in range(24)}
    data = os.urandom(20 << 20)
    with mounted(store_path, tmp_path / "m") as mnt:
        cowfs.save(state, mnt / "put.pt")
        back = cowfs.load(mnt / "put.pt")
        assert all(torch.equal(back[k], state[k]) for k in state)
        cowfs.save(state, mnt / "put.pt")  # the same again: a second version
        assert put(mnt / "put.bin", lambda f: f.write(data)) is True  # through the daemon's socket
        (mnt / "fuse.bin").write_bytes(data)
        assert (mnt / "put.bin").read_bytes() == data
        log_lines = cowfs_cli("log", str(mnt), "/put.pt").stdout.decode()
        before = json.loads(cowfs_cli("stats", "--json", str(mnt)).stdout)
        put(mnt / "again.bin", lambda f: f.write(data))  # known bytes: nothing new stored
        after = json.loads(cowfs_cli("stats", "--json", str(mnt)).stdout)
    with Store.open(store_path) as s:
        assert len(s.history(s.resolve("/put.pt").ino)) == 2, log_lines
    # the same bytes through the socket and through FUSE: the same chunks, stored once
    assert _chunks(store_path, "put.bin") == _chunks(store_path, "fuse.bin") == _chunks(store_path, "again.bin")
    assert after["stored_bytes"] == before["stored_bytes"], (before, after)


def test_save_outside_a_cowfs_mount_writes_the_file(tmp_path: Path) -> None:
    assert put(tmp_path / "plain.bin", lambda f: f.write(b"abc")) is False
    assert (tmp_path / "plain.bin").read_bytes() == b"abc"
    cowfs.save({"x": torch.arange(10)}, tmp_path / "plain.pt")
    assert torch.equal(torch.load(tmp_path / "plain.pt")["x"], torch.arange(10))


def test_a_put_in_parts_commits_what_one_part_commits(store_path: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    data = os.urandom(9 << 20) + bytes(1 << 20) + os.urandom(777)
    with mounted(store_path, tmp_path / "m") as mnt:
        (mnt / "old").write_bytes(b"old bytes")
        assert put(mnt / "whole.bin", lambda f: f.write(data)) is True
        monkeypatch.setattr("cowfs.plugins.put.PART_BYTES", 1 << 20)  # 11 parts, each sent as it fills
        assert put(mnt / "parts.bin", lambda f: [f.write(data[i:i + 100_000]) for i in range(0, len(data), 100_000)])
        assert (mnt / "parts.bin").read_bytes() == data
        # a writer killed between parts: the daemon drops what came, the file keeps its version
        pid = os.fork()
        if pid == 0:
            stream = PutStream(mnt / "old", part_bytes=1 << 20)
            stream.write(os.urandom(3 << 20))  # three parts sent, no last one
            os.kill(os.getpid(), 9)
        assert os.waitpid(pid, 0)[1] != 0
        assert (mnt / "old").read_bytes() == b"old bytes"
        assert put(mnt / "old", lambda f: f.write(b"new bytes"))  # the file takes a put again
        assert (mnt / "old").read_bytes() == b"new bytes"
    assert _chunks(store_path, "whole.bin") == _chunks(store_path, "parts.bin")


def _raw_put(mnt: Path, fds: list[int], header: bytes) -> dict:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with sock:
        sock.connect(bulk_socket_name(os.stat(mnt).st_dev))
        socket.send_fds(sock, [header], fds)
        return json.loads(sock.recv(65536).split(b"\n")[0])


def _memfd(data: bytes, seal: bool = True) -> int:
    """A memfd holding `data`: sealed against every change (`seal`), or not; an empty one is
    sealed against shrinking only (what a get "into" it wants)."""
    fd = os.memfd_create("t", os.MFD_ALLOW_SEALING)
    os.write(fd, data)
    if seal:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | (fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE if data else 0))
    return fd


def test_bad_puts_get_clear_errors_and_change_nothing(store_path: Path, tmp_path: Path) -> None:
    with mounted(store_path, tmp_path / "m") as mnt:
        (mnt / "f").write_bytes(b"before")
        data = os.urandom(100_000)
        w = os.open(mnt / "f", os.O_WRONLY)
        r = os.open(mnt / "f", os.O_RDONLY)
        d = os.open(mnt, os.O_RDONLY | os.O_DIRECTORY)
        other = os.open(tmp_path / "elsewhere", os.O_WRONLY | os.O_CREAT)

        def line(**fields: object) -> bytes:
            return json.dumps(fields).encode() + b"\n"

        header = line(op="put", fd=w, size=len(data))
        sealed, unsealed = _memfd(data), _memfd(data, seal=False)
        shrink_sealed = _memfd(b"")
        read_only = os.open(f"/proc/self/fd/{shrink_sealed}", os.O_RDONLY)
        try:
            cases = [
                ([sealed], line(op="put", fd=r, size=len(data)), errno.EBADF, "not open for writing"),
                ([sealed], line(op="put", fd=other, size=len(data)), errno.EXDEV, "not a file of this cowfs mount"),
                ([sealed], line(op="put", fd=d, size=len(data)), errno.EBADF, "not open for writing"),
                ([sealed], line(op="put", size=len(data)), errno.EINVAL, '{"fd": N}'),
                ([sealed], line(op="put", fd=999_999, size=len(data)), errno.EBADF, "cannot be read from /proc"),
                ([], header, errno.EINVAL, "1 descriptor"),
                ([r], header, errno.EINVAL, "must come in a memfd"),  # a file of this mount as the memfd: no hang
                ([sealed], line(op="put", fd=w, size=len(data) + 1), errno.EINVAL, "holds 100000"),
                ([unsealed], line(op="put", fd=w, size=len(data) + 1), errno.EINVAL, "holds 100000"),
                ([sealed], b"{not json\n", errno.EINVAL, "JSON"),
                ([sealed], b'{"op": "list"}\n', errno.EINVAL, "op is one of ['get', 'put']"),
                ([sealed], b'{"op": ["put"]}\n', errno.EINVAL, "op is one of"),
                ([sealed], b'[1, 2]\n', errno.EINVAL, "JSON object"),
                ([sealed], line(op="put", fd=w, size=True), errno.EINVAL, "malformed put"),
                ([], line(op="get", fd=w), errno.EBADF, "not open for reading"),
                ([], line(op="get", fd=d), errno.EXDEV, "not a regular file"),
                ([sealed], line(op="get", fd=r), errno.EINVAL, "no descriptor"),
                ([], line(op="get", fd=r, into=True), errno.EINVAL, "1 descriptor"),
                ([r], line(op="get", fd=r, into=True), errno.EINVAL, "is none"),
                ([unsealed], line(op="get", fd=r, into=True), errno.EPERM, "F_SEAL_SHRINK"),
                ([sealed], line(op="get", fd=r, into=True), errno.EPERM, "against nothing else"),
                ([read_only], line(op="get", fd=r, into=True), errno.EBADF, "reading and writing"),
                ([shrink_sealed], line(op="get", fd=r, into="yes"), errno.EINVAL, '"into" is true or false'),
            ]
            for fds, head, code, words in cases:
                reply = _raw_put(mnt, fds, head)
                assert reply["ok"] is False and reply["errno"] == code and words in reply["error"], reply
            assert (mnt / "f").read_bytes() == b"before"
            got = _raw_put(mnt, [shrink_sealed], line(op="get", fd=r, into=True))  # a get into it, done right
            assert got["ok"] is True and got["result"]["size"] == 6 and os.pread(shrink_sealed, 6, 0) == b"before"
            assert _raw_put(mnt, [sealed], header)["ok"] is True  # the same descriptors, done right
        finally:
            for fd in (w, r, d, other, sealed, unsealed, shrink_sealed, read_only):
                os.close(fd)
        assert (mnt / "f").read_bytes() == data
        cowfs_cli("snapshot", "create", str(mnt), "s1")
        with pytest.raises(OSError) as e:  # the kernel refuses a snapshot's file for writing at open
            put(mnt / ".snapshots" / "s1" / "f", lambda f: f.write(b"x"))
        assert e.value.errno == errno.EROFS


def _as_nobody(mnt: Path, fn) -> int:  # type: ignore[no-untyped-def]
    """fn(root) in a child that dropped to nobody (everything imported already), `root` a path
    to the mount's root that nobody can follow (the test's directories above it are root's,
    mode 0700: /proc/self/fd of a descriptor opened before the drop); its errno, 0 if it
    returned."""
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            root = Path(f"/proc/self/fd/{os.open(mnt, os.O_PATH)}")
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            fn(root)
        except OSError as e:
            code = e.errno or 255
        except BaseException:  # noqa: BLE001
            code = 254
        os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def _must(through_socket: bool) -> None:
    if not through_socket:
        raise OSError(errno.ENOTSUP, "written through FUSE, not the put socket")


def test_only_who_may_open_the_file_for_writing_can_put(store_path: Path, tmp_path: Path) -> None:
    with mounted(store_path, tmp_path / "m", "--allow-other") as mnt:
        os.chmod(mnt, 0o755)
        (mnt / "roots").write_bytes(b"root's")
        os.chmod(mnt / "roots", 0o644)
        (mnt / "open").write_bytes(b"anyone's")
        os.chmod(mnt / "open", 0o666)
        assert _as_nobody(mnt, lambda root: put(root / "roots", lambda f: f.write(b"nobody was here"))) == errno.EACCES
        assert _as_nobody(mnt, lambda root: put(root / "new", lambda f: f.write(b"x"))) == errno.EACCES  # no write on /
        assert _as_nobody(mnt, lambda root: _must(put(root / "open", lambda f: f.write(b"nobody's")))) == 0
        assert (mnt / "roots").read_bytes() == b"root's"
        assert (mnt / "open").read_bytes() == b"nobody's"
        assert not (mnt / "new").exists()


def test_a_put_into_a_full_store_fails_and_keeps_the_last_version(tmp_path: Path) -> None:
    with small_fs(tmp_path / "dev", "32m") as dev:
        store = dev / "store"
        Store.init(store, segment_size=4 << 20)
        with mounted(store, tmp_path / "m") as mnt:
            first = os.urandom(1 << 20)
            assert put(mnt / "f", lambda f: f.write(first))
            filler = fill(dev)
            with pytest.raises(PutRefused) as e:
                put(mnt / "f", lambda f: f.write(os.urandom(12 << 20)))
            assert e.value.errno == errno.ENOSPC, e.value
            assert (mnt / "f").read_bytes() == first
            # a background save that the full store refuses: its future and wait_for_saves say so
            future = cowfs.save({"w": torch.randn(3 << 20)}, mnt / "f", background=True)
            with pytest.raises(PutRefused) as e:
                future.result(timeout=120)
            assert e.value.errno == errno.ENOSPC, e.value
            with pytest.raises(PutRefused):
                cowfs.wait_for_saves()
            assert (mnt / "f").read_bytes() == first
            filler.unlink()
            second = os.urandom(6 << 20)
            assert put(mnt / "f", lambda f: f.write(second))  # space again: the same file takes a put
            assert (mnt / "f").read_bytes() == second
        assert_clean(store)


def test_puts_to_one_file_at_once_each_commit_whole(store_path: Path, tmp_path: Path) -> None:
    """Four threads put different bytes into one file at the same time: every put is one
    whole version (no mix of two), and the file ends as one of them."""
    import threading

    datas = [bytes([i]) * (9 << 20) + os.urandom(1000) for i in range(4)]
    with mounted(store_path, tmp_path / "m") as mnt:
        errors: list[BaseException] = []

        def run(i: int) -> None:
            try:
                assert put(mnt / "f", lambda f: f.write(datas[i]))
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        assert (mnt / "f").read_bytes() in datas
    with Store.open(store_path) as s:
        ino = s.resolve("/f").ino
        versions = [v for v in s.history(ino) if v.size]  # (the create's empty version aside)
        assert len(versions) == 4
        for v in versions:
            assert s.read_file("/f", gen=v.birth_gen) in datas


def _inode(fd: int) -> int:
    return os.fstat(fd).st_ino


def test_a_process_writes_its_next_put_into_the_memfds_of_the_last(store_path: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The memfds of a put the daemon answered come back (part_memfds.py) and the next put's
    bytes overwrite them; the daemon copied the unsealed parts, so the versions before keep
    their bytes. A put that ended without a reply closes its memfds instead."""
    from cowfs.plugins.part_memfds import PartMemfds

    memfds = PartMemfds(keep=64 << 20)
    monkeypatch.setattr("cowfs.plugins.put.part_memfds", lambda: memfds)
    monkeypatch.setattr("cowfs.plugins.put.PART_BYTES", 4 << 20)
    one, two = os.urandom((10 << 20) + 3), os.urandom(9 << 20)
    with mounted(store_path, tmp_path / "m") as mnt:
        stream = PutStream(mnt / "one")
        stream.write(one)
        first = [_inode(p.fd) for p in [*stream._sent, stream._part]]  # the 3 parts, 2 of them sent
        assert stream.finish() is True
        assert memfds.free == 3 and memfds.owned == 12 << 20
        stream = PutStream(mnt / "two")
        stream.write(two)
        assert sorted(_inode(p.fd) for p in [*stream._sent, stream._part]) == sorted(first)
        assert stream.finish() is True
        assert (mnt / "one").read_bytes() == one and (mnt / "two").read_bytes() == two
        assert put(mnt / "one", lambda f: f.write(b"short")) and (mnt / "one").read_bytes() == b"short"
        # the daemon never answered this one: its sent parts are not written again
        stream = PutStream(mnt / "three")
        stream.write(os.urandom(9 << 20))  # two parts sent
        stream.abort()
        assert memfds.free == 1 and memfds.owned == 4 << 20
        assert not (mnt / "three").exists() and (mnt / "two").read_bytes() == two


def test_a_client_that_writes_its_memfd_during_the_put_cannot_store_a_wrong_chunk(store_path: Path,
                                                                                   tmp_path: Path) -> None:
    """An unsealed memfd's bytes may change while the daemon takes them; the daemon hashes the
    bytes it stores (its copy), so every chunk matches its id (the store's fsck checks every
    id) and the file reads back without EIO. Reading the part in place instead failed this."""
    import threading

    size = 48 << 20
    with mounted(store_path, tmp_path / "m") as mnt:
        memfd = _memfd(os.urandom(size), seal=False)
        w = os.open(mnt / "f", os.O_WRONLY | os.O_CREAT)
        stop = threading.Event()

        def scribble() -> None:
            noise = os.urandom(1 << 16)
            k = 0
            while not stop.is_set():
                os.pwrite(memfd, noise[k % 4096:][:4096], (k * 7919 * 4096) % size)
                k += 1

        scribbler = threading.Thread(target=scribble)
        scribbler.start()
        try:
            reply = _raw_put(mnt, [memfd], json.dumps({"op": "put", "fd": w, "size": size}).encode() + b"\n")
        finally:
            stop.set()
            scribbler.join()
            os.close(memfd)
            os.close(w)
        assert reply["ok"] is True, reply
        assert len((mnt / "f").read_bytes()) == size
    assert_clean(store_path)
