"""`cowfs mount`: the daemon's life.

mount checks its inputs, forks (unless --foreground), and returns only once the
daemon reports that the filesystem is live, or with the daemon's one-line
error. The daemon owns the store (its flock), logs to STORE/cowfs.log, and on
SIGTERM, SIGINT or an unmount commits what is open, unmounts and exits.
`cowfs umount` (cowfs/unmount.py, which imports neither FUSE nor the engine) finds
the daemon through the mount table and the store's lock file, asks it to stop,
and waits for it to exit.
"""
from __future__ import annotations

import ctypes
import fcntl
import logging
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

import pyfuse3
import trio

from .. import service_remote
from ..errors import Busy, MountError, StoreError
from ..mountinfo import FSNAME_PREFIX, mount_fields, mounted_cowfs
from ..store import Store
from ..store.log.layout import LOCK_FILE, read_config
from ..units import parse_duration
from .control_server import serve_control
from .heap import keep_freed_memory
from .binding import describe as describe_binding
from .binding import is_patched
from .bulk_server import serve_bulk
from .idle_compaction import compact_when_idle
from .openers import mount_id
from .operations import CowfsOperations
from .namespace_clock import follow_peer_clocks
from .remote_uploads import upload_in_background
from .snapshot_tasks import QuietMoments, auto_snapshot, checkpoint_snapshots
from .write_requests import LIBFUSE_PIPE, libfuse_splices, pipe_limit, spliced_max_write

if TYPE_CHECKING:
    from .union_ops import Peers

log = logging.getLogger("cowfs.mount")
LOG_FILE = "cowfs.log"
DEFAULT_COMPACT_IDLE = "30s"  # compact once no file has been open for writing this long
READ_AHEAD_KIB = 4096  # the kernel's FUSE default is 128 KiB; measured in docs/benchmarks.md
MAX_WORKERS = 1024  # cowfs mount --workers at most
SNAPSHOT_ON_CHECKPOINT = "checkpoint"  # cowfs mount --snapshot-on: the events that take a snapshot


def check_mount_inputs(store: Path, mountpoint: Path) -> None:
    if not Path("/dev/fuse").exists():
        raise MountError("/dev/fuse does not exist: FUSE is not available on this machine")
    read_config(store)
    if not mountpoint.exists():
        raise MountError(f"{mountpoint}: mountpoint does not exist")
    if not mountpoint.is_dir():
        raise MountError(f"{mountpoint}: mountpoint is not a directory")
    if str(mountpoint) in mounted_cowfs() or os.path.ismount(mountpoint):
        raise MountError(f"{mountpoint}: something is already mounted there")
    if any(mountpoint.iterdir()):
        raise MountError(f"{mountpoint}: mountpoint is not empty")
    fd = os.open(store / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
        raise Busy(f"{store}: store is already mounted or in use (pid {holder or '?'})") from None
    finally:
        os.close(fd)


_libc = ctypes.CDLL(None, use_errno=True)


def syncfs(path: str) -> None:
    """syncfs(2) on the filesystem at `path`. Unlike pyfuse3.syncfs this releases the GIL
    (ctypes does), so the trio thread can serve the WRITE requests it waits for."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if _libc.syncfs(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
    finally:
        os.close(fd)


def _setup_logging(store: Path, foreground: bool, debug: bool) -> None:
    root = logging.getLogger()
    root.setLevel(logging.DEBUG if debug else logging.INFO)
    fmt = logging.Formatter("%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s")
    fh = logging.FileHandler(store / LOG_FILE)
    fh.setFormatter(fmt)
    root.addHandler(fh)
    if foreground:
        sh = logging.StreamHandler(sys.stderr)
        sh.setFormatter(fmt)
        root.addHandler(sh)


async def _serve(ops: CowfsOperations, mountpoint: Path, auto_snapshot_every: float | None, ready_fd: int | None,
                 compact_idle: float | None, snapshot_on: str | None = None, peers: "Peers | None" = None) -> None:
    quiet = QuietMoments(ops)
    async with trio.open_nursery() as nursery:
        async def on_signals() -> None:
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for sig in signals:
                    log.info("signal %d: committing open files and unmounting", sig)
                    # with the writeback cache, written bytes may still be in the kernel's page
                    # cache: have it send them (served by this loop meanwhile), then commit
                    try:
                        await trio.to_thread.run_sync(syncfs, str(mountpoint))
                    except OSError as e:
                        log.warning("syncfs before unmount: %s", e)
                    ops.handles.unmounting = True
                    await ops.commit_all()
                    pyfuse3.terminate()
                    return

        nursery.start_soon(on_signals)
        if snapshot_on == SNAPSHOT_ON_CHECKPOINT:  # subscribed before the mount is reported live
            await nursery.start(checkpoint_snapshots, quiet)
        await nursery.start(serve_bulk, ops, mountpoint)
        await go_live(nursery, ops, mountpoint, ready_fd)
        if auto_snapshot_every:
            nursery.start_soon(auto_snapshot, quiet, auto_snapshot_every)
        if compact_idle is not None:
            nursery.start_soon(compact_when_idle, ops, compact_idle)
        nursery.start_soon(upload_in_background, ops)
        nursery.start_soon(follow_peer_clocks, ops)
        if peers is not None:
            from .union_follow import follow_union
            from .union_ops import UnionOperations
            assert isinstance(ops, UnionOperations)
            nursery.start_soon(follow_union, peers.source, ops.peers_changed)
        await pyfuse3.main()
        ops.handles.unmounting = True  # a running compaction stops at its next step: the lock is freed soon
        await ops.commit_all()
        nursery.cancel_scope.cancel()


async def go_live(nursery: trio.Nursery, ops: CowfsOperations, mountpoint: Path, ready_fd: int | None) -> None:
    """What every cowfs mount (a store's, a consumer's of a bucket) does once mounted: serve
    the control socket, report live to the parent through `ready_fd`, raise the read-ahead."""
    await nursery.start(serve_control, ops, ops.store.root)
    if ready_fd is not None:  # live: mounted, and the control socket listens
        os.write(ready_fd, b"OK\n")
        os.close(ready_fd)
    nursery.start_soon(_tune_readahead, mountpoint)


async def _tune_readahead(mountpoint: Path) -> None:
    """Raise the mount's read-ahead once the kernel has its INIT reply (which resets it): a
    stat of the mountpoint from a worker thread returns only after this loop served INIT."""
    try:
        await trio.to_thread.run_sync(os.stat, mountpoint)
    except OSError:
        return  # unmounted already
    await trio.to_thread.run_sync(set_readahead, mountpoint, READ_AHEAD_KIB)


def set_readahead(mountpoint: Path, kib: int) -> None:
    """Let the kernel read ahead `kib` KiB on this mount (the FUSE default is 128 KiB, which
    caps sequential reads at 128 KiB requests). Found through the mount's device number in
    /proc/self/mountinfo, so nothing is asked of the file system itself; needs root."""
    fields = mount_fields(mountpoint)
    dev = fields[2] if fields else None  # major:minor, the name of the mount's backing device info
    try:
        if dev is None:
            raise FileNotFoundError(f"{mountpoint} is not in /proc/self/mountinfo")
        Path(f"/sys/class/bdi/{dev}/read_ahead_kb").write_text(f"{kib}\n")
    except OSError as e:
        log.warning("read-ahead left at the kernel's default (%s)", e)


def _size_write_requests(ops: CowfsOperations) -> None:
    """Ask for WRITE requests that libfuse can splice (write_requests.py), and say in the log
    what writes get: spliced requests, or a copy more and what would avoid it."""
    limit = pipe_limit()
    max_write = spliced_max_write(limit=limit)
    if max_write and is_patched():  # cowfs's build of pyfuse3 passes the size on
        ops.max_write = max_write
        log.info("WRITE requests of at most %d KiB, which libfuse receives by splice (fs.pipe-max-size is %s)",
                 max_write >> 10, limit)
    elif max_write or not libfuse_splices():
        log.info("fs.pipe-max-size is %s: writes reach cowfs without splice; `sysctl fs.pipe-max-size=%d`%s "
                 "makes them cheaper (docs/benchmarks.md)", "unreadable" if limit is None else limit, LIBFUSE_PIPE,
                 " or cowfs's build of pyfuse3 (make setup)" if max_write else "")


GIL_SWITCH_ENV = "COWFS_GIL_SWITCH_MS"
# 1 ms, not Python's 5: 16 writers on the 16-core machine 0.97 GB/s against 0.79 (one rep
# each, the same run; docs/benchmarks.md, "The GIL bounds one mount")
GIL_SWITCH_S = 0.001


def gil_switch_interval(environ: Mapping[str, str]) -> float:
    """The daemon's GIL switch interval in seconds: COWFS_GIL_SWITCH_MS if set, else 1 ms.
    A thread that waits for the GIL asks its holder to drop it after this long; the FUSE
    thread, which serves every request, waits behind the threads that run Python between
    their native calls."""
    text = environ.get(GIL_SWITCH_ENV)
    if text is None:
        return GIL_SWITCH_S
    try:
        ms = float(text)
    except ValueError:
        ms = -1.0
    if not 0.01 <= ms <= 100:
        raise MountError(f"{GIL_SWITCH_ENV}={text!r}: want milliseconds between 0.01 and 100")
    return ms / 1000


# a store's daemon: 1 MiB WRITE buffers freed a batch (8 MiB) at a time stay mapped; page
# faults per GiB written 145,000 with glibc's adaptive thresholds, 16,500 with these
# (docs/benchmarks.md, issue 33; tests/engine/test_malloc_thresholds.py)
HEAP_BELOW = 32 << 20
KEEP_FREED = 128 << 20


# numpy's OpenBLAS starts a thread per core when numpy is first imported (the first read or
# write that decodes or encodes), and they spin for a while: 0.13 CPU s, 12% of the first read
# of an old checkpoint through a new mount on 2 cores, more with more cores. The daemon never
# multiplies matrices.
BLAS_THREADS_ENV = "OPENBLAS_NUM_THREADS"


def run_daemon(store_path: Path, mountpoint: Path, *, foreground: bool, allow_other: bool,
               auto_snapshot: float | None, debug: bool = False, ready_fd: int | None = None,
               writeback_cache: bool | None = None, compact_idle: float | None = None,
               workers: int | None = None, snapshot_on: str | None = None,
               vfs_options: Sequence[str] = (), all_stores: bool = False, peers_cache_size: int = 10 << 30) -> int:
    """Open the store, mount, serve until unmounted or signalled. Reports readiness on ready_fd.
    `writeback_cache` None: CowfsOperations' default. `vfs_options`: kernel mount flags for
    libfuse (nosuid, noexec, noatime ...: mount.cowfs passes those of an fstab line)."""
    os.environ.setdefault(BLAS_THREADS_ENV, "1")  # (before numpy is imported: tests/engine/test_daemon_blas.py)
    keep_freed_memory(HEAP_BELOW, KEEP_FREED)
    sys.setswitchinterval(gil_switch_interval(os.environ))
    store = Store.open(store_path, workers=workers, pack_reader=service_remote.pack_reader)
    peers = None
    try:
        _setup_logging(store.root, foreground, debug)
        if all_stores:  # the job's namespace: the other nodes' files beside this store's own
            from .union_ops import UnionOperations, open_peers
            peers = open_peers(store, peers_cache_size)
            ops: CowfsOperations = UnionOperations(store, peers)
            log.info("showing the other stores under %s beside this one's files", peers.source.cfg.url)
        else:
            ops = CowfsOperations(store)
        if writeback_cache is not None:
            ops.enable_writeback_cache = writeback_cache
        _size_write_requests(ops)
        store.load_decoders()  # before the mount is live: beside the first reads, the imports would slow them
        options = set(pyfuse3.default_options)
        # libfuse splits options at commas: a comma in the path is escaped with a backslash
        options |= {f"fsname={FSNAME_PREFIX}{store.root}".replace("\\", "\\\\").replace(",", "\\,"), "subtype=cowfs"}
        if allow_other:
            options.add("allow_other")
        options |= set(vfs_options)
        pyfuse3.init(ops, str(mountpoint), options)
        ops.mount_id = mount_id(str(mountpoint))
        log.info("mounted %s on %s (pid %d); %s", store.root, mountpoint, os.getpid(), describe_binding())
        try:
            trio.run(_serve, ops, mountpoint, auto_snapshot, ready_fd, compact_idle, snapshot_on, peers)
        finally:
            pyfuse3.close(unmount=True)
            log.info("unmounted %s", mountpoint)
    finally:
        if peers is not None:
            peers.close()
        store.close()
    return 0


def mount(store: str, mountpoint: str, *, foreground: bool = False, allow_other: bool = False,
          auto_snapshot: str | None = None, debug: bool = False, writeback_cache: bool | None = None,
          compact_idle: str = DEFAULT_COMPACT_IDLE, workers: int | None = None, snapshot_on: str | None = None,
          vfs_options: Sequence[str] = (), all_stores: bool = False, peers_cache_size: int = 10 << 30) -> int:
    store_path = Path(store).absolute()
    mnt = Path(mountpoint).absolute()
    interval = parse_duration(auto_snapshot) if auto_snapshot else None
    if interval is not None and interval < 1:
        raise MountError("the auto-snapshot interval must be at least 1s")
    idle = None if compact_idle == "off" else parse_duration(compact_idle)
    if idle is not None and idle < 1:
        raise MountError("the compaction idle time must be at least 1s (or off)")
    if workers is not None and not 1 <= workers <= MAX_WORKERS:
        raise MountError(f"--workers must be between 1 and {MAX_WORKERS}")
    if snapshot_on not in (None, SNAPSHOT_ON_CHECKPOINT):
        raise MountError(f"--snapshot-on: unknown {snapshot_on!r} (only {SNAPSHOT_ON_CHECKPOINT!r})")
    gil_switch_interval(os.environ)  # a bad value is said here, before the daemon starts
    check_mount_inputs(store_path, mnt)

    def run(ready_fd: int | None) -> object:
        return run_daemon(store_path, mnt, foreground=ready_fd is None, allow_other=allow_other, auto_snapshot=interval,
                          debug=debug, ready_fd=ready_fd, writeback_cache=writeback_cache, compact_idle=idle,
                          workers=workers, snapshot_on=snapshot_on, vfs_options=vfs_options, all_stores=all_stores,
                          peers_cache_size=peers_cache_size)

    return start_daemon(run, foreground, f"{store_path} on {mnt}{', with the other stores of its prefix' if all_stores else ''}")


def start_daemon(run: Callable[[int | None], object], foreground: bool, what: str) -> int:
    """Run the daemon `run(ready_fd)`: here (foreground, ready_fd None), or forked into the
    background, returning once it writes OK (the mount is live) or an error line to ready_fd."""
    if foreground:
        run(None)
        return 0
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the daemon
        os.close(r)
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        code = 0
        try:
            run(w)
        except BaseException as e:  # tell the parent, in one line
            code = 2
            try:
                os.write(w, f"ERR {e}\n".encode())
            except OSError:
                pass
            logging.getLogger("cowfs.mount").exception("daemon failed")
        os._exit(code)
    os.close(w)
    msg = b""
    while True:
        part = os.read(r, 4096)
        if not part:
            break
        msg += part
        if msg.endswith(b"\n"):
            break
    os.close(r)
    text = msg.decode(errors="replace").strip()
    if text == "OK":
        print(f"mounted {what} (daemon pid {pid})")
        return 0
    os.waitpid(pid, 0)
    raise MountError(text[4:] if text.startswith("ERR ") else f"the daemon exited before the mount was live ({text or 'no message'})")


__all__ = ["mount", "run_daemon", "StoreError"]
