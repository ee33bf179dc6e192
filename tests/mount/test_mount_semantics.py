"""What checkpoint writers rely on, through a real mount: O_DIRECT (DeepSpeed FastPersist),
concurrent writers and readers, close/fsync/snapshot/SIGTERM semantics, auto-snapshots,
metadata across remount, and directory mtimes."""
from __future__ import annotations

import hashlib
import mmap
import multiprocessing
import os
import queue
import random
import re
import signal
import stat
import struct
import subprocess
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from cowfs.mountinfo import mounted_cowfs, process_alive
from cowfs.store import Store

from tests.support.mountutil import cowfs, daemon_pid, kill9, mounted
from tests.support.storeutil import data

pytestmark = pytest.mark.mount

MiB = 1 << 20


# -- helpers ------------------------------------------------------------------------------

class OtherProcess:
    """A separate process that opens and reads files on request. Start it before any file
    is open for writing: a process forked later closes its copies of the writer's fds,
    and every close() sends a FUSE FLUSH (see test_fork_while_writing_does_not_commit)."""

    CODE = r"""
import sys
for line in sys.stdin:
    try:
        with open(line[:-1], "rb") as f:
            d = f.read()
        sys.stdout.buffer.write(b"%d\n" % len(d) + d)
    except OSError as e:
        sys.stdout.buffer.write(b"-%d\n" % e.errno)
    sys.stdout.buffer.flush()
"""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", self.CODE], stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def read(self, path: Path) -> bytes:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(str(path).encode() + b"\n")
        self.proc.stdin.flush()
        n = int(self.proc.stdout.readline())
        assert n >= 0, f"{path}: {os.strerror(-n)}"
        return self.proc.stdout.read(n)

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        if self.proc.wait(timeout=30) != 0:
            raise AssertionError("reader process failed")

    def __enter__(self) -> "OtherProcess":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def describe(got: bytes, **candidates: bytes) -> str:
    """Why `got` is not what was expected: its size and how far it agrees with each candidate."""
    parts = [f"got {len(got)} bytes"]
    for name, want in candidates.items():
        same = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        parts.append(f"{name}: {len(want)} bytes, first {same} equal")
    return "; ".join(parts)


def wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while process_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    return not process_alive(pid)


def write_all(fd: int, buf: bytes) -> None:
    view = memoryview(buf)
    while view:
        view = view[os.write(fd, view):]


# -- 1. O_DIRECT, as DeepSpeed FastPersist writes ---------------------------------------------

@pytest.mark.parametrize("tail", ["reopen", "ftruncate"])
def test_odirect_aligned_blocks_then_unaligned_tail(store_path, tmp_path, tail):
    """40 MiB in 1 MiB blocks with O_DIRECT from page-aligned (mmap) buffers, then the
    unaligned tail through a second, buffered fd: either after closing the O_DIRECT fd and
    reopening, or with the O_DIRECT fd still open (ftruncate to the final size + pwrite) and
    the blocks written by 4 threads at once (queue depth 4, arrival out of order)."""
    nblocks = 40
    payload = data(nblocks * MiB + 123_457, 11)
    aligned = nblocks * MiB
    mnt = tmp_path / "mnt"
    with mounted(store_path, mnt) as m:
        (m / "ckpt").mkdir()
        path = m / "ckpt" / "mp_rank_00_model_states.pt"
        try:
            fd = os.open(path, os.O_DIRECT | os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        except OSError as e:
            pytest.fail(f"open(O_DIRECT) on cowfs failed: {e} (FUSE supports O_DIRECT unless the filesystem refuses it)")
        try:
            if tail == "reopen":
                buf = mmap.mmap(-1, MiB)
                for i in range(nblocks):
                    buf[:] = payload[i * MiB:(i + 1) * MiB]
                    assert os.pwrite(fd, buf, i * MiB) == MiB
                os.close(fd)
                fd = -1
                with open(path, "r+b") as f:  # no O_DIRECT: the unaligned rest
                    f.seek(0, os.SEEK_END)
                    assert f.tell() == aligned
                    f.write(payload[aligned:])
                    f.flush()
                    os.fsync(f.fileno())
            else:
                bufs = [mmap.mmap(-1, MiB) for _ in range(4)]

                def put(i: int) -> int:
                    b = bufs[i % 4]
                    b[:] = payload[i * MiB:(i + 1) * MiB]
                    return os.pwrite(fd, b, i * MiB)

                with ThreadPoolExecutor(4) as pool:  # block i and i+4 never share a buffer at once
                    for start in range(0, nblocks, 4):
                        assert list(pool.map(put, range(start, min(start + 4, nblocks)))) == [MiB] * min(4, nblocks - start)
                fd2 = os.open(path, os.O_WRONLY)
                try:
                    os.ftruncate(fd2, len(payload))
                    assert os.pwrite(fd2, payload[aligned:], aligned) == len(payload) - aligned
                    os.fsync(fd2)
                finally:
                    os.close(fd2)
                os.fsync(fd)
        finally:
            if fd >= 0:
                os.close(fd)
        assert os.stat(path).st_size == len(payload)
        got = path.read_bytes()
        assert got == payload, describe(got, payload=payload)
    with mounted(store_path, mnt) as m:
        got = (m / "ckpt" / "mp_rank_00_model_states.pt").read_bytes()
        assert got == payload, describe(got, payload=payload)


# -- 2. concurrent writers and readers in 4 processes -----------------------------------------

HDR = struct.Struct("<8sIII32s")  # magic, writer, version, body length, sha256(body)
MAGIC = b"COWFSCKP"
WRITERS = 4
VERSIONS = 4
CONCURRENT_DEADLINE = 45  # seconds; a run takes ~4 s on 2 cores


def _blob(writer: int, version: int, name: str) -> bytes:
    """Header + body. Bodies share content: a block common to every writer and version,
    one per writer (same in each version), and the rest unique; sizes vary."""
    rnd = random.Random(writer * 1000 + version * 10 + len(name))
    if name == "model.bin":
        size = rnd.randint(5_000_000, 10_000_000)
        body = data(2 * MiB, 7) + data(MiB, 100 + writer)
    else:
        size = rnd.randint(100_000, 1_500_000)
        body = data(64 << 10, 8)
    body = (body + rnd.randbytes(max(0, size - len(body))))[:size]
    return HDR.pack(MAGIC, writer, version, len(body), hashlib.sha256(body).digest()) + body


def _check_read(buf: bytes, writer: int, lo: int, hi: int) -> tuple[int, str | None]:
    """A read of `writer`'s file must be one whole version in [lo, hi]: lo was committed
    before the open, hi had not started yet when the read ended. Version 0 = not yet created."""
    if not buf:
        return 0, None if lo == 0 else f"empty file, but version {lo} was committed before the open"
    if len(buf) < HDR.size:
        return -1, f"torn: {len(buf)} bytes, shorter than the header"
    magic, w, v, n, digest = HDR.unpack_from(buf)
    if magic != MAGIC or w != writer:
        return -1, f"torn: bad header {buf[:HDR.size]!r}"
    if len(buf) - HDR.size != n:
        return v, f"torn: version {v} header says {n} body bytes, read {len(buf) - HDR.size}"
    if hashlib.sha256(buf[HDR.size:]).digest() != digest:
        return v, f"torn: version {v} body does not match its sha256 ({len(buf)} bytes)"
    if not lo <= v <= hi:
        return v, f"version {v} outside [{lo} committed before open, {hi} started before read end]"
    return v, None


def _concurrent_worker(me: int, mnt: str, started, opened, committed, out) -> None:  # type: ignore[no-untyped-def]
    """Write VERSIONS versions of model.bin and extra.bin under p<me>/, reading the other
    writers' files in between (mid-write and after each commit)."""
    errors: list[str] = []
    reads = 0
    raced = [0]
    try:
        root = Path(mnt)
        mine = root / f"p{me}"
        others = [w for w in range(WRITERS) if w != me]
        turn = 0

        def read_other() -> None:
            nonlocal turn, reads
            w = others[turn % len(others)]
            name = ("model.bin", "extra.bin")[(turn // len(others)) % 2]
            turn += 1
            lo = committed[w * 2 + (name == "extra.bin")]
            before = opened[w * 2 + (name == "extra.bin")]  # writer opens that completed before ours
            try:
                with open(root / f"p{w}" / name, "rb") as f:
                    buf = f.read()
            except FileNotFoundError:
                buf = b""
            hi = started[w * 2 + (name == "extra.bin")]
            v, err = _check_read(buf, w, lo, hi)
            reads += 1
            if err and hi > before:
                # a writer's open of a new version had not completed when this reader opened:
                # a reader that opens before the writer shares its page cache (docs/design.md,
                # FUSE limits), so only reads whose open came after every writer's open must be whole
                raced[0] += 1
            elif err:
                errors.append(f"reader {me}, p{w}/{name}: {err}")

        for v in range(1, VERSIONS + 1):
            for k, name in enumerate(("model.bin", "extra.bin")):
                blob = _blob(me, v, name)
                started[me * 2 + k] = v
                with open(mine / name, "wb") as f:
                    opened[me * 2 + k] = v
                    for off in range(0, len(blob), MiB):
                        f.write(blob[off:off + MiB])
                        if off == 2 * MiB:
                            read_other()  # mid-write
                committed[me * 2 + k] = v
                read_other()
        for _ in range(len(others) * 2):
            read_other()
    except BaseException:
        errors.append(f"writer {me} crashed: {traceback.format_exc()}")
    out.put((me, reads, errors))


def _wchan(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/wchan").read_text()
    except OSError:
        return "?"


@pytest.mark.timeout(150)
def test_concurrent_writers_and_readers_never_see_torn_versions(store_path, tmp_path):
    """4 processes each write 4 versions of two files (5-10 MB and 0.1-1.5 MB, sharing
    content) over the previous ones, and read the others' files mid-write and after each
    commit. Every read must be one whole version (header + sha256 of the body), no older than
    what was committed before the open, and the whole run must finish within the deadline."""
    ctx = multiprocessing.get_context("fork")
    mnt = tmp_path / "mnt"
    with mounted(store_path, mnt) as m:
        for w in range(WRITERS):
            (m / f"p{w}").mkdir()
        started = ctx.Array("i", WRITERS * 2, lock=False)
        committed = ctx.Array("i", WRITERS * 2, lock=False)
        opened = ctx.Array("i", WRITERS * 2, lock=False)
        out = ctx.Queue()
        procs = [ctx.Process(target=_concurrent_worker, args=(w, str(m), started, opened, committed, out)) for w in range(WRITERS)]
        t0 = time.monotonic()
        for p in procs:
            p.start()
        results = []
        try:
            while len(results) < len(procs) and time.monotonic() - t0 < CONCURRENT_DEADLINE:
                try:
                    results.append(out.get(timeout=1))
                except queue.Empty:
                    pass
            if len(results) < len(procs):  # hung: kill the daemon so the workers' requests fail and they exit
                stuck = {p.pid: _wchan(p.pid) for p in procs if p.is_alive()}
                kill9(store_path, mnt)
                pytest.fail(f"{len(procs) - len(results)} of {len(procs)} workers not done after {CONCURRENT_DEADLINE}s "
                            f"(the daemon was killed); still waiting in the kernel: {stuck}")
        finally:
            for p in procs:
                p.join(timeout=10)
                if p.is_alive():
                    p.kill()
                    p.join()
        errors = [e for _, _, errs in results for e in errs]
        assert not errors, f"{len(errors)} bad read(s):\n" + "\n".join(errors[:20])
        assert sum(r for _, r, _ in results) >= WRITERS * VERSIONS * 3
        for w in range(WRITERS):  # the last versions, complete
            for name in ("model.bin", "extra.bin"):
                assert (m / f"p{w}" / name).read_bytes() == _blob(w, VERSIONS, name)
    with Store.open(store_path) as s:  # every version of every file was committed, none torn
        for w in range(WRITERS):
            assert len([v for v in s.history(f"/p{w}/model.bin") if v.size > 0]) == VERSIONS


# -- 3. close semantics -------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["truncate", "in_place"])
def test_new_open_sees_last_closed_version(store_path, tmp_path, how):
    """While B is being written over A (O_TRUNC like torch.save, or rewritten in place),
    a new open from another process reads exactly A, the writer reads its own writes,
    and once the writer's close() returns a new open reads B."""
    a, b = data(6_000_000, 1), data(7_000_000, 2)
    half = 3_500_000
    with mounted(store_path, tmp_path / "mnt") as m, OtherProcess() as other:
        path = m / "model.pt"
        path.write_bytes(a)
        flags = os.O_RDWR | (os.O_TRUNC if how == "truncate" else 0)
        fd = os.open(path, flags)
        closed = False
        try:
            write_all(fd, b[:half])
            got = other.read(path)
            assert got == a, "mid-write, a new open read " + describe(got, A=a, B=b)
            own = os.pread(fd, 2 * len(b), 0)
            want_own = b[:half] if how == "truncate" else b[:half] + a[half:]
            assert own == want_own, "the writer did not read its own writes: " + describe(own, expected=want_own)
            write_all(fd, b[half:])
            got = other.read(path)
            assert got == a, "before close, a new open read " + describe(got, A=a, B=b)
            os.close(fd)
            closed = True
        finally:
            if not closed:
                os.close(fd)
        got = other.read(path)
        assert got == b, "after close, a new open read " + describe(got, A=a, B=b)
        assert path.read_bytes() == b


def test_fork_while_writing_does_not_commit(store_path, tmp_path):
    """A process holding a file open for writing runs a subprocess (git, nvidia-smi, a
    DataLoader worker...). The child's exit closes its copies of the fds, which sends FUSE
    FLUSH for the writer's file; that must not make the half-written file the committed
    version: after a crash the file must still be A."""
    a, b = data(3_000_000, 20), data(5_000_000, 21)
    mnt = tmp_path / "mnt"
    with mounted(store_path, mnt) as m:
        path = m / "model.pt"
        path.write_bytes(a)
        f = open(path, "wb")
        try:
            f.write(b[:2_000_000])
            f.flush()
            subprocess.run(["true"], check=True)
            kill9(store_path, mnt)
        finally:
            try:
                f.close()
            except OSError:
                pass
    with mounted(store_path, mnt) as m:
        got = (m / "model.pt").read_bytes()
        assert got == a, "after a subprocess ran mid-write and a crash, model.pt is " + describe(got, A=a, B=b)


# -- 4. snapshot while a file is being written --------------------------------------------------

def test_snapshot_during_write_holds_previous_version(store_path, tmp_path):
    a, b = data(4_000_000, 5), data(5_000_000, 6)
    mnt = tmp_path / "mnt"
    with mounted(store_path, mnt) as m:
        (m / "run").mkdir()
        path = m / "run" / "model.pt"
        path.write_bytes(a)
        with open(path, "wb") as f:
            f.write(b[:3_000_000])
            f.flush()
            os.mkdir(m / ".snapshots" / "s")
            snap = m / ".snapshots" / "s" / "run" / "model.pt"
            got = snap.read_bytes()
            assert got == a, "snapshot taken mid-write holds " + describe(got, A=a, B=b)
            f.write(b[3_000_000:])
        assert path.read_bytes() == b
        got = snap.read_bytes()
        assert got == a, "after close, the snapshot holds " + describe(got, A=a, B=b)
    with Store.open(store_path) as s:
        assert s.read_file("/run/model.pt", gen=s.snapshot("s").gen) == a
        assert s.read_file("/run/model.pt") == b


# -- 5. fsync commits without close --------------------------------------------------------------

def test_fsync_commits_before_close_and_survives_kill9(store_path, tmp_path):
    old, new, extra = data(2_000_000, 7), data(5_000_000, 8), data(1_000_000, 9)
    mnt = tmp_path / "mnt"
    with mounted(store_path, mnt) as m:
        path = m / "model.pt"
        path.write_bytes(old)
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
        try:
            write_all(fd, new)
            os.fsync(fd)
            write_all(fd, extra)  # not fsynced: must not count
            kill9(store_path, mnt)
        finally:
            try:
                os.close(fd)
            except OSError:
                pass
    with mounted(store_path, mnt) as m:
        got = (m / "model.pt").read_bytes()
        assert got == new, "after fsync + kill -9: " + describe(got, fsynced=new, old=old, with_extra=new + extra)


# -- 6. SIGTERM and umount commit open files ------------------------------------------------------

def test_sigterm_commits_open_file_unmounts_and_exits(store_path, tmp_path):
    blob = data(3_000_000, 10)
    mnt = tmp_path / "mnt"
    with mounted(store_path, mnt) as m:
        pid = daemon_pid(store_path)
        fd = os.open(m / "model.pt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            write_all(fd, blob)
            os.kill(pid, signal.SIGTERM)
            assert wait_gone(pid, 30), "the daemon did not exit after SIGTERM"
            assert str(mnt) not in mounted_cowfs(), "the daemon exited but left its mount"
        finally:
            try:
                os.close(fd)
            except OSError:
                pass
    with mounted(store_path, mnt) as m:
        got = (m / "model.pt").read_bytes() if (m / "model.pt").exists() else b""
        assert got == blob, "after SIGTERM with the file open: " + describe(got, written=blob)


HOLDER = r"""
import os, sys
fd = os.open(sys.argv[2], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
view = memoryview(open(sys.argv[1], "rb").read())
while view:
    view = view[os.write(fd, view):]
print("ready", flush=True)
sys.stdin.read()
try:
    os.close(fd)
except OSError:
    pass
"""


def test_umount_waits_for_daemon_exit_and_commits_open_file(store_path, tmp_path):
    """`cowfs umount` while another process (a training job) holds a file open for writing
    with data written: umount returns only once the daemon is gone, and the data is committed."""
    blob = data(3_000_000, 12)
    (tmp_path / "src.bin").write_bytes(blob)
    mnt = tmp_path / "mnt"
    with mounted(store_path, mnt) as m:
        pid = daemon_pid(store_path)
        (m / "closed.bin").write_bytes(blob[:100_000])
        holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path / "src.bin"), str(m / "open.bin")],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        try:
            assert holder.stdout is not None and holder.stdout.readline() == b"ready\n"
            cowfs("umount", str(mnt))
            assert not process_alive(pid), "cowfs umount returned while the daemon was still running"
            assert str(mnt) not in mounted_cowfs()
        finally:
            holder.communicate(timeout=30)
    with mounted(store_path, mnt) as m:
        assert (m / "closed.bin").read_bytes() == blob[:100_000]
        got = (m / "open.bin").read_bytes() if (m / "open.bin").exists() else b""
        assert got == blob, "after umount with the file open in another process: " + describe(got, written=blob)


# -- 7. --auto-snapshot ----------------------------------------------------------------------------

SNAP_NAME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")


AUTO_SNAPSHOT_WAIT = 120  # seconds: generous on a busy machine (the interval is 1 s)


def _snapshots_holding(snaps: Path, name: str, content: bytes) -> list[str]:
    out = []
    for snap in sorted(os.listdir(snaps)):
        try:
            if (snaps / snap / name).read_bytes() == content:
                out.append(snap)
        except FileNotFoundError:
            pass
    return out


def _wait_for_snapshot(snaps: Path, name: str, content: bytes) -> list[str]:
    deadline = time.monotonic() + AUTO_SNAPSHOT_WAIT
    while not (found := _snapshots_holding(snaps, name, content)):
        assert time.monotonic() < deadline, f"no auto-snapshot holding {name} = {content[:16]!r} within {AUTO_SNAPSHOT_WAIT}s"
        time.sleep(0.05)
    return found


def test_auto_snapshot_pauses_while_a_file_is_open_for_writing(store_path, tmp_path):
    """An auto-snapshot never shows a file between its create and its close: b.bin is held open
    (created, written, not closed) over several intervals, and no snapshot may hold it in that
    state (nor an empty b.bin); after the close the snapshots resume and hold its bytes."""
    with mounted(store_path, tmp_path / "mnt", "--auto-snapshot", "1s") as m:
        snaps = m / ".snapshots"
        first = data(200_000, 13)
        (m / "a.bin").write_bytes(first)
        _wait_for_snapshot(snaps, "a.bin", first)
        assert all(SNAP_NAME.fullmatch(n) for n in os.listdir(snaps)), os.listdir(snaps)
        with open(m / "b.bin", "wb") as f:
            f.write(b"partial")
            f.flush()
            time.sleep(3)  # not a wait for anything: three intervals in which a wrong daemon would snapshot
            while_open = sorted(os.listdir(snaps))
        _wait_for_snapshot(snaps, "b.bin", b"partial")
        seen = {}
        for snap in sorted(os.listdir(snaps)):
            if (snaps / snap / "b.bin").exists():
                seen[snap] = (snaps / snap / "b.bin").read_bytes()
        assert all(v == b"partial" for v in seen.values()), (
            f"auto-snapshots show b.bin before its close: {({k: v for k, v in seen.items() if v != b'partial'})}")
        assert set(_snapshots_holding(snaps, "b.bin", b"partial")).isdisjoint(while_open)


# -- 8. metadata survives umount + remount --------------------------------------------------------

def walk(root: Path) -> dict[str, tuple]:
    out: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            p = Path(dirpath) / name
            st = os.lstat(p)
            rel = str(p.relative_to(root))
            if stat.S_ISLNK(st.st_mode):
                extra = os.readlink(p)
            elif stat.S_ISREG(st.st_mode):
                extra = hashlib.sha256(p.read_bytes()).hexdigest()
            else:
                extra = None
            out[rel] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_size, st.st_mtime_ns, st.st_uid, st.st_gid, extra)
    return out


def test_tree_metadata_survives_remount(store_path, tmp_path):
    mnt = tmp_path / "mnt"
    with mounted(store_path, mnt) as m:
        (m / "run" / "checkpoint-100" / "nested").mkdir(parents=True)
        (m / "empty").mkdir(mode=0o700)
        (m / "run" / "checkpoint-100" / "model.safetensors").write_bytes(data(1_500_000, 14))
        (m / "run" / "checkpoint-100" / "nested" / "rng.pth").write_bytes(data(10_000, 15))
        (m / "run" / "checkpoint-100" / "zero.bin").write_bytes(b"")
        (m / "run" / "train.sh").write_text("#!/bin/sh\necho hi\n")
        os.chmod(m / "run" / "train.sh", 0o755)
        os.chmod(m / "run" / "checkpoint-100" / "nested" / "rng.pth", 0o600)
        os.chmod(m / "run" / "checkpoint-100", 0o750)
        os.symlink("checkpoint-100", m / "run" / "latest")
        os.symlink("/nonexistent/target", m / "run" / "dangling")
        os.utime(m / "run" / "checkpoint-100" / "model.safetensors", ns=(1_700_000_000_000_000_000, 1_700_000_000_123_456_789))
        os.utime(m / "empty", ns=(1_600_000_000_000_000_000, 1_600_000_000_000_000_001))
        os.utime(m / "run" / "latest", ns=(1_650_000_000_000_000_000, 1_650_000_000_000_000_000), follow_symlinks=False)
        before = walk(m)
        assert len(before) == 10
    with mounted(store_path, mnt) as m:
        after = walk(m)
    diff = {k: (before.get(k), after.get(k)) for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    assert not diff, "changed across umount/mount (mode, perms, size, mtime_ns, uid, gid, content/target):\n" + \
        "\n".join(f"{k}: {v[0]} -> {v[1]}" for k, v in sorted(diff.items()))


# -- 9. directory mtimes ---------------------------------------------------------------------------

def test_directory_mtime_follows_entry_changes(store_path, tmp_path):
    with mounted(store_path, tmp_path / "mnt") as m:
        d, other = m / "run", m / "other"
        d.mkdir()
        other.mkdir()

        def changes(op, *dirs: Path) -> None:  # type: ignore[no-untyped-def]
            before = [os.stat(x).st_mtime_ns for x in dirs]
            time.sleep(0.02)
            op()
            after = [os.stat(x).st_mtime_ns for x in dirs]
            for x, t0, t1 in zip(dirs, before, after):
                assert t1 > t0, f"mtime of {x.name} did not change ({t0} -> {t1}) after {op.__name__}"

        def create_file() -> None:
            (d / "checkpoint-1.bin").write_bytes(b"x")

        def make_dir() -> None:
            (d / "checkpoint-2").mkdir()

        def make_symlink() -> None:
            os.symlink("checkpoint-2", d / "latest")

        def rename_within() -> None:
            os.rename(d / "checkpoint-1.bin", d / "checkpoint-1.old")

        def rename_across() -> None:
            os.rename(d / "checkpoint-1.old", other / "checkpoint-1.old")

        def unlink_file() -> None:
            os.unlink(other / "checkpoint-1.old")

        def remove_symlink() -> None:
            os.unlink(d / "latest")

        def remove_dir() -> None:
            os.rmdir(d / "checkpoint-2")

        changes(create_file, d)
        changes(make_dir, d)
        changes(make_symlink, d)
        changes(rename_within, d)
        changes(rename_across, d, other)
        changes(unlink_file, other)
        changes(remove_symlink, d)
        changes(remove_dir, d)
        assert os.listdir(d) == [] and os.listdir(other) == []
        mtime = os.stat(d).st_mtime_ns
    with mounted(store_path, tmp_path / "mnt") as m:
        assert os.stat(m / "run").st_mtime_ns == mtime
