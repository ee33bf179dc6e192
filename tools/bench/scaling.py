"""Streams through one mount against a plain directory (issue 33): `make bench ARGS="--only
scaling"`; the report and the targets are in tools/bench/scalingreport.py.

One store (`cowfs init --device file`) mounted with `--compact-idle off` (and `--workers N`
when given) and one plain directory, both in the same work directory, hence on the same
filesystem (`--tmpfs`: a fresh tmpfs mounted for the part and unmounted after it). For each
stream count S, `reps` times, cowfs and the plain directory alternating first:

* write: S processes (tools.bench.scaling run as workers, so no GIL is shared) each write
  `mib_per_stream` MiB of their own random bytes (made once per worker; before every write a
  16-byte stamp every 8 KiB, smaller than the smallest chunk, makes each write new content) in
  4 MiB write() calls, fsync, close, each into its own file; the wall time of all streams;
* read: the page cache dropped (sync + drop_caches; cowfs also unmounted and mounted again,
  so the daemon's caches are cold too), the same S processes read their files back in 4 MiB
  reads; the SHA-256 of what each read must equal what it wrote, else the bench fails;
* then the files go (and `cowfs prune --keep-name '*'`, which drops the history they leave and
  runs gc, gives the store's space back, so 16 x 1 GiB fits a tmpfs).

Then torch: a state dict of random fp32 tensors, torch.save into a file + fsync, cold
torch.load (mmap=False, checked against what was saved), cowfs and plain alternating first.
Around every timed window: the daemon's utime + stime (/proc/PID/stat) and the machine's busy
CPU time (/proc/stat). `budget_s`: no new rep or stream count starts once it is spent.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
from contextlib import suppress
from pathlib import Path
from typing import IO, Any, Callable

from tools.harnessutil import run_cowfs

from .scalingreport import GIB, MIB, ScalingOptions

# tools.bench.mounting (and through it cowfs) is imported where a mount is made, not here:
# every stream worker imports this module, and they stay small and quick to start.

Log = Callable[[str], None]
IO_SIZE = 4 * MIB  # bytes per write() and read() call
STAMP_EVERY = 8 << 10  # < the smallest chunk (16 KiB): every chunk of a stamped buffer is new
STAMP = struct.Struct("<QQ")
REPO = Path(__file__).resolve().parents[2]
CLK_TCK = os.sysconf("SC_CLK_TCK")


# --- the stream workers: `python -m tools.bench.scaling --worker BYTES`, JSON lines on stdin/stdout

def _reply(out: IO[str], **msg: Any) -> None:
    out.write(json.dumps(msg) + "\n")
    out.flush()


def _stamp(buf: bytearray, tag: int) -> None:
    for off in range(0, len(buf) - STAMP.size + 1, STAMP_EVERY):
        STAMP.pack_into(buf, off, tag, off)


def _write_file(path: str, mv: memoryview) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        off = 0
        while off < len(mv):
            off += os.write(fd, mv[off:off + IO_SIZE])
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_file(path: str, mv: memoryview) -> int:
    """Read the file into mv in IO_SIZE reads; its length (an error if it is longer than mv)."""
    with open(path, "rb", buffering=0) as f:
        n = 0
        while True:
            got = f.readinto(mv[n:n + IO_SIZE]) if n < len(mv) else len(f.read(1))
            if not got:
                return n
            if n >= len(mv):
                raise RuntimeError(f"{path} is longer than the {len(mv)} bytes written")
            n += got


def _go(inp: IO[str]) -> bool:
    """Wait for the parent's next line: False if it says exit (or the pipe is closed)."""
    line = inp.readline()
    return bool(line) and json.loads(line).get("op") != "exit"


def worker_main(size: int) -> int:
    """One stream: `size` random bytes made once, then commands. write: stamp, hash ("armed",
    with the digest), wait for "go", write + fsync ("done"). read: "armed", wait for "go", read
    into the same buffer ("done"), wait for "verify", hash what was read. Ctrl-C is the
    parent's to handle: it tells the workers to exit, or kills them."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    inp, out = sys.stdin, sys.stdout
    buf = bytearray(size)
    mv = memoryview(buf)
    for off in range(0, size, IO_SIZE):
        piece = min(IO_SIZE, size - off)
        mv[off:off + piece] = os.urandom(piece)
    _reply(out, ready=True)
    while line := inp.readline():
        cmd = json.loads(line)
        try:
            if cmd["op"] == "write":
                _stamp(buf, cmd["tag"])
                _reply(out, armed=True, digest=hashlib.sha256(mv).hexdigest())
                if not _go(inp):
                    return 0
                _write_file(cmd["path"], mv)
                _reply(out, done=True)
            elif cmd["op"] == "read":
                _reply(out, armed=True)
                if not _go(inp):
                    return 0
                n = _read_file(cmd["path"], mv)
                _reply(out, done=True)
                if not _go(inp):
                    return 0
                _reply(out, digest=hashlib.sha256(mv[:n]).hexdigest(), bytes=n)
            else:  # exit
                return 0
        except Exception as e:  # the parent raises it, with the path
            _reply(out, error=f"{cmd['op']} {cmd.get('path')}: {e!r}")
    return 0


def machine_busy_s() -> float:
    """CPU seconds the whole machine has been busy (/proc/stat: user nice system irq softirq steal)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


class Window:
    """A timed window: wall seconds, machine busy CPU seconds, the daemon's CPU seconds."""

    def __init__(self, daemon_pid: int | None) -> None:
        from .mounting import cpu_seconds, thread_cpu_seconds  # the daemon's utime + stime, from /proc

        self._cpu, self._threads = cpu_seconds, thread_cpu_seconds
        self.pid = daemon_pid
        self.wall_s = self.busy_s = 0.0
        self.daemon_s: float | None = None
        self.daemon_threads: dict[str, float] | None = None  # CPU s per thread name
        self.busiest_thread: tuple[str, float] | None = None  # (name, its CPU s / wall s)

    def __enter__(self) -> "Window":
        self._t0_threads = self._threads(self.pid) if self.pid else None
        self._d0 = self._cpu(self.pid) if self.pid else None
        self._b0 = machine_busy_s()
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall_s = time.perf_counter() - self._t0
        self.busy_s = machine_busy_s() - self._b0
        if self.pid and self._d0 is not None:
            from .mounting import thread_cpu_delta

            self.daemon_s = self._cpu(self.pid) - self._d0
            assert self._t0_threads is not None
            after = self._threads(self.pid)
            self.daemon_threads = thread_cpu_delta(self._t0_threads, after, self.daemon_s)
            # the busiest single thread: a thread near 1.0 of the wall time bounds the run
            busiest = max(((cpu - self._t0_threads.get(tid, (name, 0.0))[1], name) for tid, (name, cpu) in after.items()),
                          default=(0.0, "-"))
            self.busiest_thread = (busiest[1], round(busiest[0] / self.wall_s, 3) if self.wall_s else 0.0)


class Streams:
    """S worker processes, each holding `size` random bytes; every command goes to all of them."""

    def __init__(self, count: int, size: int) -> None:
        self.size = size
        self.procs: list[subprocess.Popen[str]] = []
        try:
            for _ in range(count):
                self.procs.append(subprocess.Popen(
                    [sys.executable, "-m", "tools.bench.scaling", "--worker", str(size)], cwd=REPO, text=True,
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE))
            self._replies("ready")
        except BaseException:
            self.close(kill=True)
            raise

    def _send(self, msgs: list[dict[str, Any]] | dict[str, Any]) -> None:
        for i, p in enumerate(self.procs):
            assert p.stdin is not None
            p.stdin.write(json.dumps(msgs[i] if isinstance(msgs, list) else msgs) + "\n")
            p.stdin.flush()

    def _replies(self, key: str) -> list[dict[str, Any]]:
        out = []
        for i, p in enumerate(self.procs):
            assert p.stdout is not None
            line = p.stdout.readline()
            if not line:
                raise RuntimeError(f"stream worker {i} exited ({p.wait()}) before answering {key!r}")
            msg = json.loads(line)
            if "error" in msg:
                raise RuntimeError(f"stream worker {i}: {msg['error']}")
            out.append(msg)
        return out

    def write(self, paths: list[Path], tags: list[int], window: Window) -> list[str]:
        """Every stream writes its file (timed in `window`); their SHA-256 digests."""
        self._send([{"op": "write", "path": str(p), "tag": t} for p, t in zip(paths, tags)])
        digests = [m["digest"] for m in self._replies("armed")]
        with window:
            self._send({"op": "go"})
            self._replies("done")
        return digests

    def read(self, paths: list[Path], digests: list[str], window: Window) -> None:
        """Every stream reads its file back (timed in `window`); fails loudly on a wrong byte."""
        self._send([{"op": "read", "path": str(p)} for p in paths])
        self._replies("armed")
        with window:
            self._send({"op": "go"})
            self._replies("done")
        self._send({"op": "verify"})
        for i, (p, want, got) in enumerate(zip(paths, digests, self._replies("digest"))):
            if got["bytes"] != self.size or got["digest"] != want:
                raise RuntimeError(f"stream {i} read back {got['bytes']} bytes of {p} with SHA-256 {got['digest']}, "
                                   f"but wrote {self.size} bytes with SHA-256 {want}")

    def close(self, kill: bool = False) -> None:
        """Tell every worker to exit and wait for it; `kill`: kill them outright (after an error
        or Ctrl-C, when a worker may be blocked in a write or read)."""
        for p in self.procs:
            try:
                if kill:
                    p.kill()
                elif p.poll() is None and p.stdin is not None:
                    p.stdin.write(json.dumps({"op": "exit"}) + "\n")
                    p.stdin.close()
            except OSError:
                pass
        for p in self.procs:
            if p.stdin is not None and not p.stdin.closed:
                with suppress(OSError):
                    p.stdin.close()
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            if p.stdout is not None:
                p.stdout.close()
        self.procs = []

    def __enter__(self) -> "Streams":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        self.close(kill=exc_type is not None)


class CowfsMount:
    """The part's one store on `mnt`, with the options of the issue; remounted for cold reads."""

    def __init__(self, store: Path, mnt: Path, workers: int | None, writeback: str = "default") -> None:
        self.store, self.mnt, self.workers, self.writeback = store, mnt, workers, writeback
        self.pid: int | None = None

    def mount(self) -> None:
        from .mounting import mount_store

        extra = ["--workers", str(self.workers)] if self.workers else []
        if self.writeback != "default":
            extra.append("--writeback-cache" if self.writeback == "on" else "--no-writeback-cache")
        self.pid = mount_store(self.store, self.mnt, "--compact-idle", "off", *extra)

    def unmount(self) -> None:
        from .mounting import unmount

        if self.pid is not None:
            unmount(self.mnt, self.pid)
            self.pid = None

    def cold(self) -> bool:
        """Unmount, drop the page cache, mount again: nothing of the files cached anywhere."""
        from .mounting import drop_caches

        self.unmount()
        dropped = drop_caches()
        self.mount()
        return dropped

    def gc(self) -> None:
        """Give the space of removed files back: cowfs keeps the versions a removal ended as
        history until a prune drops them (here every snapshot is kept, only that history goes),
        and its gc then frees their chunks. `cowfs gc` alone frees nothing of them."""
        run_cowfs("prune", str(self.mnt), "--keep-name", "*", timeout=600)


def filesystem(path: Path) -> tuple[str, str]:
    """(type, "TYPE on SOURCE (PATH)") of the filesystem holding `path`, from /proc/self/mounts."""
    best = ("?", "?", "")
    with open("/proc/self/mounts") as f:
        for line in f:
            dev, mnt, fstype = line.split()[:3]
            if (str(path).startswith(mnt.rstrip("/") + "/") or str(path) == mnt) and len(mnt) >= len(best[2]):
                best = (dev, fstype, mnt)
    return best[1], f"{best[1]} on {best[0]} ({path})"


class _Part:
    """The state of one run of the part: the mount, the plain directory, the runs so far."""

    def __init__(self, root: Path, opts: ScalingOptions, log: Log) -> None:
        self.opts, self.log = opts, log
        self.mount = CowfsMount(root / "store", root / "mnt", opts.workers, opts.writeback)
        self.plain = root / "plain"
        self.runs: list[dict[str, Any]] = []
        self.skipped: list[str] = []
        self.caches_dropped = True
        self.started = time.monotonic()

    def over_budget(self) -> bool:
        return self.opts.budget_s is not None and time.monotonic() - self.started > self.opts.budget_s

    def record(self, part: str, s: int, rep: int, arm: str, nbytes: int, w: Window) -> dict[str, Any]:
        run = {"part": part, "S": s, "rep": rep, "arm": arm, "bytes": nbytes, "wall_s": w.wall_s,
               "busy_cpu_s": w.busy_s, "daemon_cpu_s": w.daemon_s, "daemon_threads": w.daemon_threads,
               "busiest_thread": w.busiest_thread}
        self.runs.append(run)
        return run

    def arm_dir(self, arm: str) -> Path:
        return self.mount.mnt / "scaling" if arm == "cowfs" else self.plain

    def make_cold(self, arm: str) -> None:
        from .mounting import drop_caches

        dropped = self.mount.cold() if arm == "cowfs" else drop_caches()
        self.caches_dropped = self.caches_dropped and dropped

    def cleanup(self, arm: str, paths: list[Path], failed: bool = False) -> None:
        """Remove the arm's files; for cowfs `cowfs gc` gives their space back (not after a failure:
        then the store goes as a whole, and an error here must not hide the first one)."""
        if failed:
            with suppress(Exception):
                for p in paths:
                    p.unlink(missing_ok=True)
            return
        for p in paths:
            p.unlink(missing_ok=True)
        if arm == "cowfs":
            self.mount.gc()

    def streams_arm(self, streams: Streams, s: int, rep: int, arm: str) -> str:
        d = self.arm_dir(arm)
        paths = [d / f"s{s}-r{rep}-{i}.bin" for i in range(s)]
        tags = [((s * 1000 + rep) * 2 + (arm == "cowfs")) * 1000 + i for i in range(s)]
        try:
            w = Window(self.mount.pid if arm == "cowfs" else None)
            digests = streams.write(paths, tags, w)
            wr = self.record("write", s, rep, arm, s * streams.size, w)
            self.make_cold(arm)
            r = Window(self.mount.pid if arm == "cowfs" else None)
            streams.read(paths, digests, r)
            rd = self.record("read", s, rep, arm, s * streams.size, r)
        except BaseException:
            self.cleanup(arm, paths, failed=True)
            raise
        self.cleanup(arm, paths)
        return f"{arm} write {wr['bytes'] / 1e9 / wr['wall_s']:.2f} read {rd['bytes'] / 1e9 / rd['wall_s']:.2f} GB/s"

    def torch_arm(self, sd: dict[str, Any], rep: int, arm: str) -> str:
        import torch

        path = self.arm_dir(arm) / f"torch-r{rep}.pt"
        try:
            w = Window(self.mount.pid if arm == "cowfs" else None)
            with w:
                with open(path, "wb") as f:
                    torch.save(sd, f)
                    f.flush()
                    os.fsync(f.fileno())
            nbytes = path.stat().st_size
            self.record("torch-save", 1, rep, arm, nbytes, w)
            self.make_cold(arm)
            r = Window(self.mount.pid if arm == "cowfs" else None)
            with r:
                loaded = torch.load(path, map_location="cpu", mmap=False, weights_only=True)
            self.record("torch-load", 1, rep, arm, nbytes, r)
            if loaded.keys() != sd.keys() or not all(torch.equal(loaded[k], sd[k]) for k in sd):
                raise RuntimeError(f"torch.load of {path} did not give back the state dict torch.save wrote")
            del loaded
        except BaseException:
            self.cleanup(arm, [path], failed=True)
            raise
        self.cleanup(arm, [path])
        return f"{arm} save {nbytes / 1e9 / w.wall_s:.2f} load {nbytes / 1e9 / r.wall_s:.2f} GB/s"

    def run(self) -> None:
        opts = self.opts
        size = opts.mib_per_stream * MIB
        for s in opts.streams:
            if self.runs and self.over_budget():
                self.skipped.append(f"S={s}")
                continue
            self.log(f"  scaling S={s}: starting {s} stream worker(s) with {opts.mib_per_stream} MiB each")
            with Streams(s, size) as streams:
                for rep in range(opts.reps):
                    if rep and self.over_budget():
                        self.skipped.append(f"S={s} reps {rep + 1}-{opts.reps}")
                        break
                    arms = ("cowfs", "plain") if rep % 2 == 0 else ("plain", "cowfs")
                    done = [self.streams_arm(streams, s, rep, arm) for arm in arms]
                    self.log(f"  scaling S={s} rep {rep + 1}/{opts.reps}: " + "; ".join(done))
        if opts.torch_gib <= 0:
            return
        from .datapath import state_dict

        for rep in range(opts.reps):
            if self.over_budget():
                self.skipped.append(f"torch reps {rep + 1}-{opts.reps}")
                break
            sd = state_dict(int(opts.torch_gib * GIB), 33_000 + rep)  # a new seed per rep: nothing to deduplicate
            arms = ("cowfs", "plain") if rep % 2 == 0 else ("plain", "cowfs")
            done = [self.torch_arm(sd, rep, arm) for arm in arms]
            self.log(f"  scaling torch rep {rep + 1}/{opts.reps}: " + "; ".join(done))
            del sd


def mount_tmpfs(where: Path, nbytes: int) -> None:
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={nbytes},mode=0755", "tmpfs", str(where)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"--tmpfs: mounting a tmpfs on {where} failed (root only): {r.stderr.strip()}")


def unmount_tmpfs(where: Path) -> None:
    if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
        print(f"bench: umount {where} failed; lazy unmount", file=sys.stderr)
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def run_scaling(work: Path, opts: ScalingOptions, log: Log) -> dict[str, Any]:
    """The part in `work` (created here; on a fresh tmpfs with opts.tmpfs); everything it made
    is unmounted and removed however it ends."""
    from .mounting import init_store

    work.mkdir(parents=True)
    on_tmpfs = False
    try:
        if opts.tmpfs:
            mount_tmpfs(work, opts.tmpfs_bytes())
            on_tmpfs = True
            log(f"  scaling: a tmpfs of {opts.tmpfs_bytes() / GIB:.1f} GiB on {work}")
        fs_type, fs = filesystem(work)
        part = _Part(work, opts, log)
        part.plain.mkdir()
        init_store(part.mount.store, device="file")
        part.mount.mount()
        try:
            (part.mount.mnt / "scaling").mkdir()
            part.run()
        finally:
            part.mount.unmount()
        from cowfs.fs.binding import pyfuse3_version  # the daemon runs in this interpreter's environment
        return {"fs": fs, "fs_type": fs_type, "cpus": os.cpu_count() or 1, "pyfuse3": pyfuse3_version(),
                "streams": opts.streams,
                "mib_per_stream": opts.mib_per_stream, "reps": opts.reps, "torch_gib": opts.torch_gib,
                "torch_bytes": next((r["bytes"] for r in part.runs if r["part"] == "torch-save"), 0),
                "workers": opts.workers, "writeback": opts.writeback, "tmpfs": opts.tmpfs, "budget_s": opts.budget_s, "skipped": part.skipped,
                "elapsed_s": time.monotonic() - part.started, "caches_dropped": part.caches_dropped,
                "runs": part.runs}
    finally:
        if on_tmpfs:
            unmount_tmpfs(work)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        sys.exit(worker_main(int(sys.argv[2])))
    print("python -m tools.bench.scaling is the stream worker of the scaling part; run "
          "`python -m tools.bench --only scaling`", file=sys.stderr)
    sys.exit(2)
