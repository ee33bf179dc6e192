"""The FUSE binding's own ceiling: a pyfuse3 file system that stores nothing.

Files live in a dict (name -> bytes) of one directory; every handler answers at once on
the trio thread, with the same mount options and request sequence as cowfs's mount
(default_permissions, no writeback cache, entry and attribute timeouts of 1 s, extended
attributes answered). What it measures is what pyfuse3, trio and the kernel's FUSE code
cost per request on this machine, with no catalog, log or thread hop behind them: the
small-file rate no handler code can beat.

With `--serve FILE` it also shows FILE as `served`, each READ answered by one `os.pread`
of FILE on the trio thread (no verification, no windows, no thread hop): the cold-read
rate of a daemon that only copies, against which cowfs's reads are measured.

    python -m tools.bench.noop_fs MOUNTPOINT [--serve FILE]  # serve until SIGTERM / Ctrl-C
    python -m tools.bench.noop_fs --small-files N            # mount, time N small files, unmount
    python -m tools.bench.noop_fs --cold-read FILE           # mount, cold cat of FILE vs through it
"""
from __future__ import annotations

import argparse
import contextlib
import errno
import os
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pyfuse3
import trio

from cowfs.fs.mount import READ_AHEAD_KIB, set_readahead

from .mounting import cpu_seconds, drop_caches

ROOT = pyfuse3.ROOT_INODE
TIMEOUT = 1.0
SERVED = b"served"  # the name of --serve's file


class NoopFs(pyfuse3.Operations):
    enable_writeback_cache = False

    def __init__(self, serve: str | None = None) -> None:
        super().__init__()
        self.names: dict[bytes, int] = {}
        self.served_fd = os.open(serve, os.O_RDONLY) if serve else -1
        self.served_ino = 0
        self.data: dict[int, bytes] = {}
        self.modes: dict[int, int] = {ROOT: stat.S_IFDIR | 0o755}
        self.next_ino = ROOT + 1
        self.next_fh = 1
        self.requests: dict[str, int] = {}
        if serve:
            self.served_ino, self.next_ino = self.next_ino, self.next_ino + 1
            self.names[SERVED] = self.served_ino
            self.modes[self.served_ino] = stat.S_IFREG | 0o444

    def _count(self, op: str) -> None:
        self.requests[op] = self.requests.get(op, 0) + 1

    def _entry(self, ino: int) -> pyfuse3.EntryAttributes:
        e = pyfuse3.EntryAttributes()
        e.st_ino = ino
        e.entry_timeout = e.attr_timeout = TIMEOUT
        e.st_mode = self.modes[ino]
        e.st_nlink = 2 if ino == ROOT else 1
        e.st_uid, e.st_gid = os.getuid(), os.getgid()
        e.st_size = os.fstat(self.served_fd).st_size if self.served_fd >= 0 and ino == self.served_ino else len(self.data.get(ino, b""))
        e.st_blksize = 4 << 20  # as cowfs's (fs/attrs.py): cat and cp read and write 4 MiB at a time
        e.st_blocks = (e.st_size + 511) // 512
        now = time.time_ns()
        e.st_atime_ns = e.st_mtime_ns = e.st_ctime_ns = now
        return e

    async def lookup(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        self._count("lookup")
        ino = self.names.get(name) if parent_inode == ROOT else None
        if ino is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._entry(ino)

    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        self._count("getattr")
        if inode not in self.modes:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._entry(inode)

    async def create(self, parent_inode: int, name: bytes, mode: int, flags: int,
                     ctx: pyfuse3.RequestContext) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        self._count("create")
        ino, self.next_ino = self.next_ino, self.next_ino + 1
        self.names[name] = ino
        self.modes[ino] = stat.S_IFREG | (mode & 0o7777)
        self.data[ino] = b""
        fh, self.next_fh = self.next_fh, self.next_fh + 1
        return pyfuse3.FileInfo(fh=fh, keep_cache=True), self._entry(ino)

    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        self._count("open")
        fh, self.next_fh = self.next_fh, self.next_fh + 1
        return pyfuse3.FileInfo(fh=fh, keep_cache=True)

    async def read(self, fh: int, off: int, size: int) -> bytes:
        self._count("read")
        if self.served_fd < 0:
            raise pyfuse3.FUSEError(errno.EIO)
        return os.pread(self.served_fd, size, off)

    async def write(self, fh: int, off: int, buf: bytes) -> int:
        self._count("write")
        return len(buf)  # nothing kept: the binding's cost, not a store's

    async def getxattr(self, inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> bytes:
        self._count("getxattr")
        raise pyfuse3.FUSEError(errno.ENODATA)

    async def flush(self, fh: int) -> None:
        self._count("flush")

    async def release(self, fh: int) -> None:
        self._count("release")

    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        return inode

    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        return None

    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        s = pyfuse3.StatvfsData()
        s.f_bsize = s.f_frsize = 4096
        s.f_namemax = 255
        return s


def serve(mountpoint: str, ready: int | None = None, file: str | None = None) -> None:
    fs = NoopFs(file)
    opts = set(pyfuse3.default_options) | {"fsname=noopfs", "default_permissions"}
    pyfuse3.init(fs, mountpoint, opts)
    set_readahead(Path(mountpoint), READ_AHEAD_KIB)  # as cowfs's mount sets it
    if ready is not None:
        os.write(ready, b"1")
        os.close(ready)

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pyfuse3.main)
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for _ in signals:
                    nursery.cancel_scope.cancel()
                    break

    try:
        trio.run(run)
    finally:
        pyfuse3.close(unmount=True)
        print(" ".join(f"{k}={v}" for k, v in sorted(fs.requests.items())), file=sys.stderr)


@contextlib.contextmanager
def _mounted(serve: Path | None = None) -> Iterator[tuple[Path, int]]:
    """The no-op file system mounted by a child process: (mountpoint, its pid); unmounted after."""
    with tempfile.TemporaryDirectory(dir="/var/tmp", prefix="noopfs-") as tmp:
        mnt = Path(tmp) / "mnt"
        mnt.mkdir()
        r, w = os.pipe()
        extra = ["--serve", str(serve)] if serve else []
        child = subprocess.Popen([sys.executable, "-m", "tools.bench.noop_fs", str(mnt), "--ready-fd", str(w), *extra],
                                 pass_fds=(w,), cwd=Path(__file__).resolve().parents[2])  # the repository
        os.close(w)
        try:
            if os.read(r, 1) != b"1":
                raise SystemExit("the no-op file system did not mount")
            yield mnt, child.pid
        finally:
            os.close(r)
            child.send_signal(signal.SIGTERM)
            child.wait(timeout=60)


def small_files_rate(n: int, writers: int, rounds: int) -> list[tuple[float, float]]:
    """Mount the no-op file system in a child process, time `rounds` runs of `n` small
    files by `writers` threads (tools.bench.datapath's workload), print and return files/s
    and the daemon's CPU ms per file of each round, unmount."""
    from .datapath import small_files

    rates: list[tuple[float, float]] = []
    with _mounted() as (mnt, pid):
        for k in range(rounds):
            c0, t0 = cpu_seconds(pid), time.perf_counter()
            small_files(mnt, n, writers, prefix=f"r{k}f")  # names of its own per round: one flat directory
            dt, c1 = time.perf_counter() - t0, cpu_seconds(pid)
            rates.append((n / dt, 1e3 * (c1 - c0) / n))
            print(f"no-op pyfuse3: {rates[-1][0]:.0f} files/s, daemon {rates[-1][1]:.3f} ms CPU per file")
    return rates


def cold_read_rate(path: Path, rounds: int) -> list[tuple[float, float, float]]:
    """Cold `cat` of `path` from the disk and through the no-op file system's one-pread-per-READ
    `served` file, alternating (page cache dropped before each), `rounds` pairs: print and
    return (MB/s through it, MB/s from the disk, its daemon's CPU s per GiB) per pair."""
    from .datapath import _cat

    size = path.stat().st_size
    out: list[tuple[float, float, float]] = []
    with _mounted(path) as (mnt, pid):
        for k in range(rounds):
            got: dict[str, float] = {}
            for side in (("disk", "noop") if k % 2 == 0 else ("noop", "disk")):
                drop_caches()
                c0, t0 = cpu_seconds(pid), time.perf_counter()
                _cat(path if side == "disk" else mnt / SERVED.decode())
                got[side], got[side + "_cpu"] = time.perf_counter() - t0, cpu_seconds(pid) - c0
            out.append((size / got["noop"] / 1e6, size / got["disk"] / 1e6, got["noop_cpu"] * (1 << 30) / size))
            print(f"cold cat: no-op pyfuse3 {out[-1][0]:.0f} MB/s, disk {out[-1][1]:.0f} MB/s "
                  f"({out[-1][0] / out[-1][1]:.2f}x), daemon {out[-1][2]:.2f} CPU s/GiB")
    return out


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m tools.bench.noop_fs", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mountpoint", nargs="?")
    p.add_argument("--ready-fd", type=int, help=argparse.SUPPRESS)
    p.add_argument("--small-files", type=int, metavar="N", help="time N small files into a fresh mount")
    p.add_argument("--serve", metavar="FILE", help="show FILE as `served`, read by one pread per READ")
    p.add_argument("--cold-read", metavar="FILE", type=Path, help="time cold cats of FILE, from the disk and through a mount")
    p.add_argument("--writers", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    if a.small_files:
        small_files_rate(a.small_files, a.writers, a.rounds)
    elif a.cold_read:
        cold_read_rate(a.cold_read, a.rounds)
    elif a.mountpoint:
        serve(a.mountpoint, a.ready_fd, a.serve)
    else:
        p.error("give a MOUNTPOINT, --small-files N or --cold-read FILE")


if __name__ == "__main__":
    main()
