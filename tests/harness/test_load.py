"""Load test (issue 5): the harness tools/loadtest/ runs 8 writer processes saving and
re-reading torch/safetensors checkpoints through one mount, reading each other's files and
snapshots, while snapshots are taken, deleted and pruned and gc runs; every byte read is
checked, then fsck and every snapshot are verified unmounted. The harness runs as a
subprocess (`python -m tools.loadtest` from the repository root).

Also here: two bugs the harness found, as direct tests. A read-only file whose name a rename
(or unlink) took away while it was open failed its close() with EIO (the kernel writes back
the unlink's ctime, and the daemon refused the SETATTR on a removed inode); and an open that
raced a rename over its file failed with ENOENT (the kernel's dentry still named the replaced
inode, which the daemon would no longer open)."""
from __future__ import annotations

import hashlib
import os
import random
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from cowfs.mountinfo import mounted_cowfs

from tests.support.mountutil import mounted

pytestmark = pytest.mark.mount

REPO = Path(__file__).resolve().parents[2]  # `python -m tools.loadtest` runs from here
SUMMARY = re.compile(r"^load: (?P<procs>\d+) procs, (?P<checkpoints>\d+) checkpoints written, (?P<verified>\S+ \S+) verified, "
                     r"(?P<snapshots>\d+) snapshots, (?P<gc>\d+) gc runs, (?P<errors>\d+) errors, (?P<fsck>fsck .*)$", re.M)


def run_loadtest(workdir: Path, procs: int, seconds: int, timeout: float) -> re.Match:
    seed = int(os.environ.get("COWFS_LOAD_SEED", random.randrange(1 << 31)))
    cmd = [sys.executable, "-m", "tools.loadtest", "--procs", str(procs), "--seconds", str(seconds), "--seed", str(seed),
           "--workdir", str(workdir)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
                            cwd=REPO)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)  # the harness stops its writers and unmounts
        try:
            out, _ = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        pytest.fail(f"loadtest (seed {seed}) not done after {timeout:.0f}s; its output:\n{out}")
    finally:
        mnt = workdir / "mnt"
        assert str(mnt) not in mounted_cowfs(), f"the harness left {mnt} mounted"
    m = SUMMARY.search(out)
    assert proc.returncode == 0 and m and m["errors"] == "0" and m["fsck"] == "fsck clean", (
        f"loadtest --procs {procs} --seconds {seconds} --seed {seed} exited {proc.returncode}; "
        f"rerun with COWFS_LOAD_SEED={seed}. Output:\n{out}")
    return m


@pytest.mark.long
@pytest.mark.timeout(400)
def test_load_8_procs(tmp_path: Path) -> None:
    m = run_loadtest(tmp_path / "load", procs=8, seconds=25, timeout=300)
    print(m.group(0))  # the harness's summary line, shown with -rA / -s
    assert m["procs"] == "8"
    assert int(m["checkpoints"]) >= 8  # every writer wrote
    assert int(m["snapshots"]) >= 2  # at least one while writing, and the final one
    assert int(m["gc"]) >= 1


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_load_8_procs_5_minutes(tmp_path: Path) -> None:
    m = run_loadtest(tmp_path / "load", procs=8, seconds=300, timeout=1500)
    assert int(m["snapshots"]) >= 20 and int(m["gc"]) >= 10


@pytest.mark.parametrize("how", ["rename over it", "unlink"])
def test_close_of_a_reader_after_its_file_was_replaced(store_path: Path, tmp_path: Path, how: str) -> None:
    with mounted(store_path, tmp_path / "mnt") as m:
        old, new = os.urandom(50_000), os.urandom(70_000)
        (m / "ckpt.pt").write_bytes(old)
        (m / "ckpt.tmp").write_bytes(new)
        f = open(m / "ckpt.pt", "rb")
        if how == "unlink":
            os.unlink(m / "ckpt.pt")
        else:
            os.replace(m / "ckpt.tmp", m / "ckpt.pt")
        assert f.read() == old  # the reader keeps the version it opened
        f.close()  # was EIO
        if how != "unlink":
            assert (m / "ckpt.pt").read_bytes() == new


def test_readers_of_a_file_replaced_by_rename_never_fail(store_path: Path, tmp_path: Path) -> None:
    """Two reader threads open and read a file while it is replaced 150 times (temp + rename,
    half of them renamed before their close like safetensors): every open succeeds and every
    read is one whole version."""
    versions: set[str] = set()
    failures: list[str] = []
    done = threading.Event()

    def reader(m: Path) -> None:
        while not done.is_set():
            try:
                with open(m / "model.safetensors", "rb") as f:
                    digest = hashlib.sha256(f.read()).hexdigest()
            except OSError as e:
                failures.append(f"{type(e).__name__}: {e}")
                continue
            if digest not in versions:
                failures.append(f"read a version never written (sha256 {digest[:16]})")

    with mounted(store_path, tmp_path / "mnt") as m:
        first = os.urandom(100_000)
        versions.add(hashlib.sha256(first).hexdigest())
        (m / "model.safetensors").write_bytes(first)
        threads = [threading.Thread(target=reader, args=(m,)) for _ in range(2)]
        for t in threads:
            t.start()
        try:
            for i in range(150):
                body = os.urandom(100_000)
                versions.add(hashlib.sha256(body).hexdigest())
                tmp = m / f".tmp-{i}"
                with open(tmp, "wb") as f:
                    f.write(body)
                    f.flush()
                    if i % 2:
                        os.replace(tmp, m / "model.safetensors")  # before the close
                if not i % 2:
                    os.replace(tmp, m / "model.safetensors")
        finally:
            done.set()
            for t in threads:
                t.join()
    assert not failures, f"{len(failures)} failed reads, e.g. {failures[:5]}"
