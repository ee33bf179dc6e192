#!/usr/bin/env python3
"""Crash test: kill -9 the mount daemon while real checkpoints are being saved, then check.

    python tools/crashtest.py --cycles N [--seed S] [--store DIR] [--keep]

Each cycle:

1. A writer process saves real checkpoints in a loop into the mount (MNT/run/), the way
   training code does: (a) torch.save of a ~3 MB model state dict (half of it frozen, so
   chunks dedup) over a fixed `model.pt` (in-place O_TRUNC rewrite), (b) safetensors
   save_file to a temporary name + os.replace onto `model.safetensors`, (c) an HF-style
   `checkpoint-N/` directory (model.safetensors, optimizer.pt, trainer_state.json last),
   rotated to keep the newest 2. Before it opens a file it logs a `begin` record with the
   sha256 of the bytes it is about to write; once close() has returned it logs `closed`.
   Records go to a JSON-lines file on a non-cowfs path (fsynced each) and to a pipe.
2. Meanwhile the harness takes snapshots (`mkdir MNT/.snapshots/NAME`), records the sha256
   of every file in each one right after the mkdir, and deletes the oldest ones (rmdir)
   beyond --max-snapshots.
3. At a random moment (a random delay, or a short random delay after a chosen writer
   event: a file open, a close, a rename, a rotation, a checkpoint mkdir, or after a
   snapshot mkdir started) it kills the daemon with SIGKILL (pid from STORE/lock), kills
   the writer, and lazily unmounts (fusermount3 -u -z).
4. Unmounted: `cowfs fsck STORE` must exit 0; the history of every file closed in this
   cycle (Store API) must hold each closed version and nothing but complete versions;
   history is expired (most cycles) and `cowfs gc` runs (some cycles).
5. Remounted: every path in the live tree must be in a state the writer's log allows (the
   last closed version, or, when the writer had begun the next one, that complete next
   version; a file being created may also be empty; nothing torn, nothing unknown; a rename
   is all or nothing), every non-empty live file must load (torch.load / safetensors
   load_file / json), and every retained snapshot must hold exactly the bytes recorded when
   it was taken (and, the first time, only complete versions). A snapshot whose mkdir or
   rmdir the kill interrupted may exist or not; if it exists it is recorded then.

With --overwrite-safetensors the writer also does (d): save_file straight over an existing
`model-direct.safetensors`. safetensors 0.8 writes a `.tmp<random>` sibling, renames it onto
the target and closes it only after the rename, so a kill in that window (rarely hit at
random) leaves the target empty: neither its previous nor its new version.

One line per cycle, then `K/N recovered`. Exit 0 only when every cycle recovered. The
harness unmounts and kills only what it started (its writer and its mount's daemon), also
on Ctrl-C, SIGTERM or failure. Without --workdir/--store everything lives in a temporary
directory that is removed after a fully successful run (kept with --keep or on failure).
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Iterable

EMPTY = hashlib.sha256(b"").hexdigest()
DIR = "DIR"
RUN = "run"  # the writer's directory under the mount root
KEEP_CHECKPOINTS = 2
MiB = 1 << 20


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def sha_file(path: Path) -> tuple[str, int]:
    h = hashlib.sha256()
    n = 0
    with open(path, "rb") as f:
        while True:
            b = f.read(1 << 20)
            if not b:
                break
            h.update(b)
            n += len(b)
    return h.hexdigest(), n


# ===================================================================================
# writer process (python tools/crashtest.py _writer ...)
# ===================================================================================

def writer_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="crashtest.py _writer")
    ap.add_argument("--root", required=True)  # MNT/run
    ap.add_argument("--log", required=True)  # JSON-lines file on a non-cowfs path
    ap.add_argument("--scratch", required=True)  # non-cowfs directory for the self-check
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--step0", type=int, required=True)
    ap.add_argument("--ppid", type=int, required=True)
    ap.add_argument("--overwrite-safetensors", action="store_true")
    args = ap.parse_args(argv)

    import torch
    from safetensors.torch import save as st_save
    from safetensors.torch import save_file as st_save_file

    torch.set_num_threads(1)
    rng = random.Random(args.seed)
    root = Path(args.root)
    scratch = Path(args.scratch)
    scratch.mkdir(parents=True, exist_ok=True)
    logf = open(args.log, "a")

    def rec(ev: str, **kw: Any) -> None:
        line = json.dumps({"ev": ev, "t": time.monotonic(), **kw})
        logf.write(line + "\n")
        logf.flush()
        os.fsync(logf.fileno())
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(1024, 256)
            self.body = torch.nn.ModuleList(torch.nn.Linear(256, 256) for _ in range(6))
            self.head = torch.nn.Linear(256, 512)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.embed(x).mean(1)
            for layer in self.body:
                h = h + torch.relu(layer(h))
            return self.head(h)

    torch.manual_seed(1234)  # same initial weights in every cycle: the frozen part dedups
    model = Net()
    for mod in (model.embed, *model.body[:3]):  # ~1.8 MB of 3.2 MB frozen
        for p in mod.parameters():
            p.requires_grad_(False)

    def torch_bytes(obj: Any, name: str, how: str) -> bytes:
        """The exact bytes torch.save writes: through a path the zip's root folder is the
        file's stem, through a file object it is 'archive'."""
        if how == "path":
            p = scratch / name
            torch.save(obj, str(p))
            return p.read_bytes()
        buf = io.BytesIO()
        torch.save(obj, buf)
        return buf.getvalue()

    # self-check on a non-cowfs path: the bytes computed up front are the bytes written
    sd = model.state_dict()
    for how in ("path", "file"):
        want = torch_bytes(sd, "model.pt", how)
        q = scratch / "selfcheck" / "model.pt"
        q.parent.mkdir(exist_ok=True)
        if how == "path":
            torch.save(sd, str(q))
        else:
            with open(q, "wb") as f:
                torch.save(sd, f)
        if q.read_bytes() != want:
            raise SystemExit(f"torch.save ({how}) is not deterministic here; the harness cannot predict its bytes")
    tens = {k: v.contiguous() for k, v in sd.items()}
    st_save_file(tens, str(scratch / "selfcheck" / "m.st"), metadata={"step": "0"})
    if (scratch / "selfcheck" / "m.st").read_bytes() != st_save(tens, metadata={"step": "0"}):
        raise SystemExit("safetensors save_file and save differ; the harness cannot predict the bytes")

    # warm up before reporting ready: the first optimizer step imports torch._dynamo (~1.5 s)
    dummy = torch.nn.Parameter(torch.zeros(4))
    warm = torch.optim.AdamW([dummy], lr=1e-3)
    torch.nn.functional.cross_entropy(model(torch.zeros(2, 8, dtype=torch.long)), torch.zeros(2, dtype=torch.long))
    dummy.sum().backward()
    warm.step()
    rec("ready", pid=os.getpid())
    if sys.stdin.readline().strip() != "go":
        return 0

    def rel(p: Path) -> str:
        return f"{RUN}/{p.relative_to(root)}" if p != root else RUN

    def alive_check(p: Path) -> None:
        """Libraries that write through their own descriptor (torch's C++ writer, the Rust
        safetensors writer) ignore close() errors. An open() is always a request to the
        daemon: it fails once the connection is gone, so a close that failed because the
        daemon died is never reported as returned."""
        os.close(os.open(p, os.O_RDONLY))

    def save(p: Path, data: bytes, step: int, how: str, write: Callable[[], None]) -> None:
        digest = hashlib.sha256(data).hexdigest()
        rec("begin", path=rel(p), sha=digest, size=len(data), step=step, how=how)
        write()
        rec("closed", path=rel(p), sha=digest, size=len(data), step=step)

    def save_torch(p: Path, obj: Any, step: int) -> None:
        how = rng.choice(("path", "file"))
        data = torch_bytes(obj, p.name, how)

        def write() -> None:
            if how == "path":
                torch.save(obj, str(p))  # std::ofstream: open(O_WRONLY|O_CREAT|O_TRUNC)
                alive_check(p)
            else:
                with open(p, "wb") as f:  # Python raises if close() fails
                    torch.save(obj, f)
                    f.flush()
                    rec("closing", path=rel(p), step=step)

        save(p, data, step, f"torch.save/{how}", write)

    def save_st(p: Path, tensors: dict, step: int) -> None:
        meta = {"step": str(step)}
        data = st_save(tensors, metadata=meta)

        def write() -> None:
            st_save_file(tensors, str(p), metadata=meta)
            alive_check(p)

        save(p, data, step, "save_file", write)

    def save_text(p: Path, text: str, step: int) -> None:
        data = text.encode()

        def write() -> None:
            with open(p, "wb") as f:
                f.write(data)
                f.flush()
                rec("closing", path=rel(p), step=step)

        save(p, data, step, "write", write)

    rec("started", step0=args.step0)
    # resume from the last checkpoint like a restarted job (the harness checked it loads)
    if (root / "model.pt").exists() and (root / "model.pt").stat().st_size > 0:
        model.load_state_dict(torch.load(root / "model.pt", map_location="cpu", weights_only=True))
    # stale temporaries of a killed run
    for name in sorted(os.listdir(root)):
        if ".tmp." in name or re.fullmatch(r"\.tmp[A-Za-z0-9]{6}", name):
            rec("unlink_begin", path=rel(root / name))
            os.unlink(root / name)
            rec("unlinked", path=rel(root / name))

    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-3)
    step = args.step0
    while True:
        if os.getppid() != args.ppid:  # the harness is gone: stop
            return 0
        x = torch.randint(0, 1024, (16, 8))
        y = torch.randint(0, 512, (16,))
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sd = model.state_dict()
        tensors = {k: v.contiguous() for k, v in sd.items()}

        # (a) in-place rewrite of a fixed path
        save_torch(root / "model.pt", sd, step)
        # (b) write to a temporary name, then rename over the live file
        tmp = root / f"model.safetensors.tmp.{step}"
        save_st(tmp, tensors, step)
        rec("rename_begin", src=rel(tmp), dst=rel(root / "model.safetensors"), step=step)
        os.replace(tmp, root / "model.safetensors")
        rec("renamed", src=rel(tmp), dst=rel(root / "model.safetensors"), step=step)
        if args.overwrite_safetensors:  # (d) save_file straight over the previous file
            save_st(root / "model-direct.safetensors", tensors, step)
        # (c) HF Trainer layout, trainer_state.json last, then rotation
        ck = root / f"checkpoint-{step}"
        rec("mkdir_begin", path=rel(ck), step=step)
        ck.mkdir()
        rec("mkdir_done", path=rel(ck), step=step)
        save_st(ck / "model.safetensors", tensors, step)
        save_torch(ck / "optimizer.pt", opt.state_dict(), step)
        state = {"global_step": step, "loss": round(float(loss.detach()), 6), "best_model_checkpoint": None,
                 "log_history": [{"step": step, "loss": round(float(loss.detach()), 6)}]}
        save_text(ck / "trainer_state.json", json.dumps(state, indent=2), step)
        cks = sorted((int(n.split("-", 1)[1]), n) for n in os.listdir(root)
                     if n.startswith("checkpoint-") and n.split("-", 1)[1].isdigit())
        for _, name in cks[:-KEEP_CHECKPOINTS]:
            rec("rmtree_begin", path=rel(root / name), step=step)
            shutil.rmtree(root / name)
            rec("rmtree_done", path=rel(root / name), step=step)
        step += 1


# ===================================================================================
# inspect process (unmounted store, Store API): history of closed files, expiry
# ===================================================================================

def inspect_main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    from cowfs.store import Store
    from cowfs.store import namespace as ns

    out: dict[str, Any] = {"problems": [], "versions": 0, "bytes": 0, "expired": None}
    with Store.open(spec["store"]) as s:
        for path, want in spec["closed"].items():
            allowed = set(spec["ever"][path]) | {EMPTY}
            seen: dict[str, int] = {}
            inos = s.catalog.read(lambda conn: ns.inodes_ever_at(conn, "/" + path))
            for ino, v in ((ino, v) for ino in inos for v in s.history(ino)):
                try:
                    with s.open_reader(ino, v.birth_gen) as reader:
                        data = reader.read(0, reader.size)
                except Exception as e:  # noqa: BLE001 - reported
                    out["problems"].append(f"history of {path}: version born at gen {v.birth_gen} unreadable: {e!r}")
                    continue
                digest = hashlib.sha256(data).hexdigest()
                seen[digest] = v.birth_gen
                out["versions"] += 1
                out["bytes"] += len(data)
                if digest not in allowed:
                    out["problems"].append(
                        f"history of {path}: version born at gen {v.birth_gen} ({len(data)} bytes, sha {digest[:12]}) "
                        f"is no complete version the writer wrote")
            for digest in want:
                if digest not in seen:
                    out["problems"].append(f"history of {path}: closed version sha {digest[:12]} is not in the history "
                                           f"(close() had returned)")
        if spec.get("expire"):
            out["expired"] = s.expire_history(0)
    print(json.dumps(out))
    return 0


# ===================================================================================
# harness
# ===================================================================================

class HarnessError(Exception):
    """A failure of the harness itself (not a finding about cowfs)."""


class Model:
    """Which states each path may be in, from the writer's records. A state is DIR, a
    sha256 of the whole file, or None (absent)."""

    def __init__(self) -> None:
        self.allowed: dict[str, set] = {RUN: {DIR}}
        self.ever: dict[str, set] = {RUN: {DIR}}
        self.pending_renames: list[tuple[str, str, set, set]] = []
        self.what: dict[str, str] = {EMPTY: "empty (freshly created)"}  # sha -> description
        # safetensors' save_file (0.8) writes a `.tmp<random>` sibling, renames it onto the
        # target and only then closes it: until its close, that sibling may exist (empty)
        self.tmp_pending: dict[str, int] = {}  # dir -> save_file writes begun, not closed
        self.tmp_dirs_ever: set[str] = set()
        self.how: dict[str, str] = {}  # path -> how its pending write is done

    def get(self, path: str) -> set:
        return self.allowed.get(path, {None})

    def _set(self, path: str, states: Iterable) -> None:
        self.allowed[path] = set(states)
        self.ever.setdefault(path, set()).update(self.allowed[path])

    def apply(self, r: dict) -> None:
        ev = r["ev"]
        if ev == "begin":
            prev = self.get(r["path"])
            new = prev | {r["sha"]}
            if None in prev:  # open(O_CREAT) makes an empty file first
                new.add(EMPTY)
            self.what.setdefault(r["sha"], f"step {r['step']} ({r['size']} bytes, {r['how']})")
            self._set(r["path"], new)
            self.how[r["path"]] = r["how"]
            if r["how"] == "save_file":
                d = os.path.dirname(r["path"])
                self.tmp_pending[d] = self.tmp_pending.get(d, 0) + 1
                self.tmp_dirs_ever.add(d)
        elif ev == "closed":
            self._set(r["path"], {r["sha"]})
            if self.how.pop(r["path"], None) == "save_file":
                d = os.path.dirname(r["path"])
                self.tmp_pending[d] -= 1
                if not self.tmp_pending[d]:
                    del self.tmp_pending[d]
        elif ev == "rename_begin":
            src, dst = r["src"], r["dst"]
            self.pending_renames.append((src, dst, set(self.get(dst)), set(self.get(src))))
            self._set(dst, self.get(dst) | self.get(src))
            self._set(src, self.get(src) | {None})
        elif ev == "renamed":
            for i, (src, dst, _, src_states) in enumerate(self.pending_renames):
                if (src, dst) == (r["src"], r["dst"]):
                    self._set(dst, src_states)
                    self._set(src, {None})
                    del self.pending_renames[i]
                    break
        elif ev == "unlink_begin":
            self._set(r["path"], self.get(r["path"]) | {None})
        elif ev == "unlinked":
            self._set(r["path"], {None})
        elif ev == "mkdir_begin":
            self._set(r["path"], self.get(r["path"]) | {DIR})
        elif ev == "mkdir_done":
            self._set(r["path"], {DIR})
        elif ev in ("rmtree_begin", "rmtree_done"):
            d = r["path"]
            for p in [p for p in self.allowed if p == d or p.startswith(d + "/")]:
                self._set(p, (self.get(p) | {None}) if ev == "rmtree_begin" else {None})

    def may_be_save_file_tmp(self, path: str, state: str | None, ever: bool = False) -> bool:
        """An empty `.tmp<random>` left by a save_file that was under way (or ever ran: `ever`)."""
        d, name = os.path.split(path)
        return (state == EMPTY and re.fullmatch(r"\.tmp[A-Za-z0-9]{6}", name) is not None
                and d in (self.tmp_dirs_ever if ever else self.tmp_pending))

    def settle(self, live: dict[str, str]) -> None:
        """After a check: what is live is now the one state of every path."""
        self.tmp_pending.clear()
        self.how.clear()
        for p in set(self.allowed) | set(live):
            if p in live:
                self._set(p, {live[p]})
            else:
                self.allowed.pop(p, None)
        self.pending_renames.clear()

    def describe(self, state: str | None) -> str:
        if state is None:
            return "absent"
        if state == DIR:
            return "a directory"
        return f"{state[:12]} [{self.what.get(state, 'unknown content')}]"


class Snapshot:
    def __init__(self, name: str, cycle: int) -> None:
        self.name = name
        self.cycle = cycle
        self.files: dict[str, tuple[str, int]] | None = None  # rel path -> (sha or DIR, size)
        self.validated = False  # checked against the model once


def walk_tree(top: Path) -> dict[str, tuple[str, int]]:
    """rel path -> (DIR or sha256, size) of everything under top (no symlinks expected)."""
    out: dict[str, tuple[str, int]] = {}

    def err(e: OSError) -> None:
        raise e

    for dirpath, dirnames, filenames in os.walk(top, onerror=err):
        d = Path(dirpath)
        for name in dirnames:
            out[str((d / name).relative_to(top))] = (DIR, 0)
        for name in filenames:
            out[str((d / name).relative_to(top))] = sha_file(d / name)
    return out


def proc_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1][0] not in "ZX"
    except (OSError, IndexError):
        return False


def mounted_at(mnt: Path) -> bool:
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split(" - ")[0].split()
            if len(fields) > 4 and fields[4].encode().decode("unicode_escape") == str(mnt):
                return True
    return False


class Writer:
    """One writer process, started ahead of its cycle (torch's import takes seconds)."""

    def __init__(self, h: "Harness", cycle: int, seed: int, step0: int) -> None:
        self.cycle = cycle
        self.log = h.logs / f"writer-{cycle:03d}.jsonl"
        self.errpath = h.logs / f"writer-{cycle:03d}.err"
        self.records: list[tuple[float, dict]] = []  # as received on the pipe
        self.listeners: list[Callable[[dict], None]] = []
        self.ready = threading.Event()
        self.lock = threading.Lock()
        self.err = open(self.errpath, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "_writer", "--root", str(h.mnt / RUN), "--log", str(self.log),
             "--scratch", str(h.work / "scratch"), "--seed", str(seed), "--step0", str(step0), "--ppid", str(os.getpid())]
            + (["--overwrite-safetensors"] if h.args.overwrite_safetensors else []),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err, start_new_session=True)
        self.reader = threading.Thread(target=self._read, name=f"writer-{cycle}-pipe", daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                r = json.loads(line)
            except ValueError:
                continue
            with self.lock:
                self.records.append((time.monotonic(), r))
                listeners = list(self.listeners)
            if r["ev"] == "ready":
                self.ready.set()
            for fn in listeners:
                fn(r)

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"go\n")
        self.proc.stdin.flush()

    def last_record(self) -> dict | None:
        with self.lock:
            return self.records[-1][1] if self.records else None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            raise HarnessError(f"writer pid {self.proc.pid} did not die after SIGKILL within 30 s "
                               f"(stuck in the kernel: {Path(f'/proc/{self.proc.pid}/wchan').read_text()})")
        self.reader.join(timeout=10)
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                if f:
                    f.close()
            except OSError:
                pass
        self.err.close()

    def stderr_tail(self, n: int = 15) -> str:
        try:
            lines = self.errpath.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def file_records(self) -> list[dict]:
        out = []
        with open(self.log) as f:
            for line in f:
                if line.endswith("\n"):
                    out.append(json.loads(line))
        return out


TARGETS = [  # (weight, kind, event, max nth, max delay in s)
    (28, "time", None, 0, 0.0),
    (14, "event", "begin", 10, 0.080),      # mid-write (data still in the kernel's cache or in the daemon)
    (14, "event", "closing", 6, 0.020),     # close() under way: inside the commit
    (5, "event", "closed", 6, 0.002),       # right after a close returned
    (11, "event", "rename_begin", 3, 0.003),
    (12, "snapshot", None, 2, 0.006),       # during a snapshot mkdir
    (9, "event", "rmtree_begin", 2, 0.006),  # checkpoint rotation
    (7, "event", "mkdir_begin", 3, 0.003),
]


class Harness:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
        self.rng = random.Random(self.seed)
        if args.workdir:
            self.work = Path(args.workdir).absolute()
            self.work.mkdir(parents=True, exist_ok=True)
            self.own_work = False
        else:
            self.work = Path(tempfile.mkdtemp(prefix="cowfs-crash-"))
            self.own_work = True
        self.store = Path(args.store).absolute() if args.store else self.work / "store"
        self.mnt = self.work / "mnt"
        self.logs = self.work / "logs"
        self.logs.mkdir(exist_ok=True)
        self.mnt.mkdir(exist_ok=True)
        self.model = Model()
        self.snapshots: dict[str, Snapshot] = {}  # recorded, oldest first
        self.uncertain: dict[str, str] = {}  # name -> "mkdir" | "rmdir": interrupted by the kill
        self.daemon_pid: int | None = None
        self.writer: Writer | None = None
        self.next_writer: Writer | None = None
        self.next_step = 0
        self.loaded: set[str] = set()  # shas already loaded with torch/safetensors
        self.totals: dict[str, Any] = {"kills": 0, "bytes": 0, "files": 0, "closed": 0, "snapshots": 0,
                                       "history_versions": 0, "writer_at_kill": {}, "in_snapshot_mkdir": 0,
                                       "gc_runs": 0, "gc_freed": 0, "expired": 0}

    # -- processes we start ----------------------------------------------------------

    def cowfs(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "cowfs.cli", *args], capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)

    def mount(self) -> None:
        r = self.cowfs("mount", str(self.store), str(self.mnt), timeout=120)
        if r.returncode != 0:
            raise HarnessError(f"cowfs mount failed ({r.returncode}): {r.stderr.strip()}")
        m = re.search(r"daemon pid (\d+)", r.stdout)
        lock_pid = (self.store / "lock").read_text().strip()
        if not m or not lock_pid.isdigit() or int(lock_pid) != int(m.group(1)):
            raise HarnessError(f"daemon pid unclear: mount said {r.stdout.strip()!r}, STORE/lock holds {lock_pid!r}")
        self.daemon_pid = int(lock_pid)

    def kill_daemon(self) -> None:
        if self.daemon_pid is not None and proc_alive(self.daemon_pid):
            os.kill(self.daemon_pid, signal.SIGKILL)

    def wait_daemon_gone(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while self.daemon_pid is not None and proc_alive(self.daemon_pid):
            if time.monotonic() > deadline:
                raise HarnessError(f"daemon pid {self.daemon_pid} still alive {timeout:.0f} s after SIGKILL")
            time.sleep(0.01)
        self.daemon_pid = None

    def lazy_unmount(self) -> None:
        if mounted_at(self.mnt):
            subprocess.run(["fusermount3", "-u", "-z", str(self.mnt)], capture_output=True, timeout=60)
        if mounted_at(self.mnt):
            raise HarnessError(f"{self.mnt} still mounted after fusermount3 -u -z")

    def cleanup(self) -> None:
        """Stop what we started: the writers, then our daemon (clean umount first)."""
        for w in (self.writer, self.next_writer):
            if w is not None:
                try:
                    w.kill()
                except Exception:  # noqa: BLE001
                    pass
        if self.daemon_pid is None and mounted_at(self.mnt):
            # interrupted inside `cowfs mount`: the daemon of our store on our mountpoint is ours
            text = (self.store / "lock").read_text().strip() if (self.store / "lock").exists() else ""
            self.daemon_pid = int(text) if text.isdigit() else None
        if self.daemon_pid is not None and proc_alive(self.daemon_pid) and mounted_at(self.mnt):
            try:
                r = self.cowfs("umount", str(self.mnt), timeout=120)
                ok = r.returncode == 0
            except subprocess.TimeoutExpired:
                ok = False
            if not ok:
                self.kill_daemon()
        if self.daemon_pid is not None:
            try:
                self.wait_daemon_gone(10)
            except HarnessError:
                pass
        if mounted_at(self.mnt):
            subprocess.run(["fusermount3", "-u", "-z", str(self.mnt)], capture_output=True, timeout=60)

    # -- one cycle ---------------------------------------------------------------------

    def spawn_writer(self, cycle: int) -> Writer:
        return Writer(self, cycle, self.rng.randrange(1 << 31), self.next_step)

    def run_cycle(self, cycle: int) -> tuple[bool, str, list[str]]:
        t0 = time.monotonic()
        cseed = self.rng.randrange(1 << 31)
        rng = random.Random(cseed)
        problems: list[str] = []
        w = self.next_writer or self.spawn_writer(cycle)
        self.next_writer = None
        self.writer = w
        if not w.ready.wait(120):
            raise HarnessError(f"writer not ready after 120 s: {w.stderr_tail()}")

        # what to kill on
        weights = [t[0] for t in TARGETS]
        _, kind, event, max_nth, max_delay = rng.choices(TARGETS, weights)[0]
        nth = rng.randint(1, max_nth) if max_nth else 0
        delay = rng.uniform(0, max_delay) if kind != "time" else rng.uniform(0.05, self.args.max_run)
        fired = threading.Event()
        fire_lock = threading.Lock()
        state: dict[str, Any] = {"snap": "idle", "reason": None, "writer": None, "t": None, "snap_count": 0}

        def fire(reason: str) -> None:
            with fire_lock:
                if fired.is_set():
                    return
                state["t"] = time.monotonic()
                state["writer"] = w.last_record()
                state["snap_at_kill"] = state["snap"]
                state["reason"] = reason
                fired.set()
                self.kill_daemon()

        if kind == "event":
            seen = [0]

            def on_record(r: dict) -> None:
                if r["ev"] == event:
                    seen[0] += 1
                    if seen[0] == nth:
                        if delay:
                            time.sleep(delay)
                        fire(f"{event}#{nth}+{delay * 1e3:.1f}ms")
            with w.lock:
                w.listeners.append(on_record)

        # the snapshot thread
        stop = threading.Event()
        snap_errors: list[str] = []

        def snapshotter() -> None:
            k = 0
            while not stop.wait(rng.uniform(0.15, 0.9)):
                if fired.is_set():
                    return
                name = f"c{cycle:03d}-{k}"
                k += 1
                state["snap_count"] += 1
                self.uncertain[name] = "mkdir"
                state["snap"] = f"mkdir {name}"
                if kind == "snapshot" and state["snap_count"] == nth:
                    threading.Timer(delay, fire, (f"snapshot#{nth}+{delay * 1e3:.1f}ms",)).start()
                try:
                    os.mkdir(self.mnt / ".snapshots" / name)
                    state["snap"] = f"reading {name}"
                    files = walk_tree(self.mnt / ".snapshots" / name)
                except OSError as e:
                    if not fired.is_set():
                        snap_errors.append(f"snapshot {name}: {e!r} while the daemon was alive")
                    return
                snap = Snapshot(name, cycle)
                snap.files = files
                self.snapshots[name] = snap
                del self.uncertain[name]
                while len(self.snapshots) > self.args.max_snapshots:
                    old = next(iter(self.snapshots))
                    self.uncertain[old] = "rmdir"
                    state["snap"] = f"rmdir {old}"
                    try:
                        os.rmdir(self.mnt / ".snapshots" / old)
                    except OSError as e:
                        if not fired.is_set():
                            snap_errors.append(f"rmdir snapshot {old}: {e!r} while the daemon was alive")
                        return
                    del self.snapshots[old]
                    del self.uncertain[old]
                state["snap"] = "idle"

        w.go()
        t_go = time.monotonic()
        snap_thread = threading.Thread(target=snapshotter, name="snapshots", daemon=True)
        snap_thread.start()
        deadline = t_go + (delay if kind == "time" else self.args.max_run + 3)
        early_exit = None
        while not fired.wait(0.01):
            if w.proc.poll() is not None:
                early_exit = w.proc.returncode
                fire("writer exited")
                break
            if snap_errors:
                fire("snapshot error")
                break
            if time.monotonic() >= deadline:
                fire(f"time {delay:.2f}s" if kind == "time" else f"time (no {kind} {event or ''}#{nth})")
        # kill -9 the daemon (done in fire), kill the writer, lazy unmount
        w.kill()
        stop.set()
        snap_thread.join(30)
        if snap_thread.is_alive():
            raise HarnessError("the snapshot thread is stuck after the daemon was killed")
        self.wait_daemon_gone()
        self.lazy_unmount()
        self.writer = None
        kill_after = state["t"] - t_go
        if early_exit is not None:
            problems.append(f"the writer exited ({early_exit}) before the kill:\n{w.stderr_tail()}")
        problems.extend(snap_errors)

        # the writer's durable log
        records = w.file_records()
        closed_now: dict[str, list[str]] = {}
        for r in records:
            self.model.apply(r)
            if r["ev"] == "closed":
                closed_now.setdefault(r["path"], []).append(r["sha"])
            if "step" in r:
                self.next_step = max(self.next_step, r["step"] + 1)
        steps = len({r["step"] for r in records if "step" in r})
        n_closed = sum(len(v) for v in closed_now.values())
        self.totals["closed"] += n_closed
        self.totals["kills"] += 1
        wr = state["writer"]
        phase = writer_phase(wr)
        self.totals["writer_at_kill"][phase] = self.totals["writer_at_kill"].get(phase, 0) + 1
        if state["snap_at_kill"].startswith("mkdir"):
            self.totals["in_snapshot_mkdir"] += 1
        if cycle + 1 < self.args.cycles:  # start the next writer now: its import overlaps the checks
            self.next_writer = self.spawn_writer(cycle + 1)

        # unmounted: fsck, history, expiry, gc
        t = time.monotonic()
        r = self.cowfs("fsck", str(self.store))
        fsck_s = time.monotonic() - t
        fsck_note = f"fsck {'clean' if r.returncode == 0 else 'FAILED'} {fsck_s:.1f}s"
        if r.returncode != 0:
            problems.append(f"cowfs fsck exited {r.returncode}:\n{r.stdout.strip()}\n{r.stderr.strip()}")
        expire = rng.random() < 0.75
        spec = {"store": str(self.store), "expire": expire,
                "closed": {p: v for p, v in closed_now.items()},
                "ever": {p: sorted(x for x in self.model.ever.get(p, ()) if x not in (None, DIR)) for p in closed_now}}
        spec_path = self.logs / f"inspect-{cycle:03d}.json"
        spec_path.write_text(json.dumps(spec))
        r = subprocess.run([sys.executable, os.path.abspath(__file__), "_inspect", str(spec_path)],
                           capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
        verified = 0
        if r.returncode != 0:
            problems.append(f"history check failed ({r.returncode}): {r.stderr.strip()[-2000:]}")
        else:
            res = json.loads(r.stdout)
            problems.extend(res["problems"])
            verified += res["bytes"]
            self.totals["history_versions"] += res["versions"]
            self.totals["expired"] += res["expired"] or 0
        gc_note = ""
        if rng.random() < self.args.gc_prob:
            r = self.cowfs("gc", str(self.store))
            if r.returncode != 0:
                problems.append(f"cowfs gc exited {r.returncode}: {r.stderr.strip()}")
            else:
                self.totals["gc_runs"] += 1
                m = re.search(r"chunks deleted, ([\d.]+) (B|KiB|MiB|GiB) freed", r.stdout)
                if m:
                    self.totals["gc_freed"] += float(m.group(1)) * {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}[m.group(2)]
                gc_note = ", gc " + (f"{m.group(1)} {m.group(2)} freed" if m else "ran")

        # remount and check
        self.mount()
        vbytes, nfiles, nsnaps = self.check(problems)
        verified += vbytes
        self.totals["bytes"] += verified
        self.totals["files"] += nfiles
        self.totals["snapshots"] += nsnaps

        ok = not problems
        snap_at = state["snap_at_kill"]
        line = (f"cycle {cycle + 1:>3}/{self.args.cycles} seed {cseed}: kill {kill_after:.2f}s in [{state['reason']}] "
                f"writer {phase}{'' if phase == 'starting' else ' ' + str((wr or {}).get('path') or (wr or {}).get('src') or '')}"
                f", snapshots {snap_at} | {steps} steps, {n_closed} closes | {fsck_note}{gc_note} | "
                f"{nfiles} files + {nsnaps} snapshots, {human(verified)} verified | "
                f"{'recovered' if ok else 'FAILED'} ({time.monotonic() - t0:.1f}s)")
        return ok, line, problems

    # -- checks after remount ------------------------------------------------------------

    def load(self, path: Path, digest: str) -> None:
        """The file must load with the library that wrote it (once per distinct content)."""
        if digest in self.loaded:
            return
        name = path.name
        if name.endswith(".pt"):
            import torch
            torch.load(path, map_location="cpu", weights_only=True)
        elif ".safetensors" in name:
            from safetensors.torch import load_file
            load_file(str(path))
        elif name.endswith(".json"):
            json.loads(path.read_text())
        self.loaded.add(digest)

    def check(self, problems: list[str]) -> tuple[int, int, int]:
        model = self.model
        verified = 0
        nfiles = 0
        try:
            tree = walk_tree(self.mnt)
        except OSError as e:
            problems.append(f"walking the live tree: {e!r}")
            return 0, 0, 0
        live = {p: st for p, (st, _) in tree.items()}
        for p in sorted(set(live) | {p for p, a in model.allowed.items() if a != {None}}):
            got = live.get(p)
            allowed = model.get(p)
            if got not in allowed and not (allowed == {None} and model.may_be_save_file_tmp(p, got)):
                problems.append(f"{p}: live state {model.describe(got)}; allowed: "
                                + ", ".join(sorted(model.describe(s) for s in allowed)))
            elif got not in (None, DIR):
                nfiles += 1
                verified += tree[p][1]
        for src, dst, dst_before, src_states in model.pending_renames:
            if live.get(src) is not None and live.get(dst) not in dst_before:
                problems.append(f"rename {src} -> {dst} half done: {src} still exists but {dst} is "
                                f"{model.describe(live.get(dst))}")
            if live.get(src) is None and live.get(dst) not in src_states:
                problems.append(f"rename {src} -> {dst}: {src} is gone but {dst} is {model.describe(live.get(dst))}")
        for p, st in sorted(live.items()):
            if st not in (None, DIR, EMPTY):
                try:
                    self.load(self.mnt / p, st)
                except Exception as e:  # noqa: BLE001 - reported
                    problems.append(f"{p}: does not load: {e!r}")

        # snapshots
        nsnaps = 0
        snapdir = self.mnt / ".snapshots"
        try:
            present = set(os.listdir(snapdir))
        except OSError as e:
            problems.append(f"listing .snapshots: {e!r}")
            present = set()
        for name in list(self.snapshots):
            if name not in present:
                if self.uncertain.get(name) == "rmdir":
                    del self.snapshots[name]
                    del self.uncertain[name]
                else:
                    problems.append(f"snapshot {name} (taken in cycle {self.snapshots[name].cycle + 1}) is gone")
                    del self.snapshots[name]
        for name in sorted(present):
            snap = self.snapshots.get(name)
            if snap is None:
                if self.uncertain.get(name) != "mkdir":
                    problems.append(f"unknown snapshot {name} in .snapshots")
                    continue
                snap = Snapshot(name, int(name[1:4]))  # its mkdir was interrupted by the kill but it exists
            try:
                files = walk_tree(snapdir / name)
            except OSError as e:
                problems.append(f"snapshot {name}: reading it: {e!r}")
                continue
            if snap.files is None:
                snap.files = files
                self.snapshots[name] = snap
            self.uncertain.pop(name, None)
            nsnaps += 1
            for p in sorted(set(files) | set(snap.files)):
                want, got = snap.files.get(p), files.get(p)
                if want != got:
                    problems.append(f"snapshot {name}: {p} is {model.describe(got and got[0])}, "
                                    f"recorded {model.describe(want and want[0])} when the snapshot was taken")
                elif got[0] != DIR:
                    verified += got[1]
            if not snap.validated:  # taken while the writer ran: only complete versions
                for p, (st, _) in sorted(snap.files.items()):
                    if st not in model.ever.get(p, set()) and not model.may_be_save_file_tmp(p, st, ever=True):
                        problems.append(f"snapshot {name}: {p} is {model.describe(st)}, never a complete "
                                        f"state of {p} (torn or unknown)")
                    elif st not in (DIR, EMPTY):
                        try:
                            self.load(snapdir / name / p, st)
                        except Exception as e:  # noqa: BLE001
                            problems.append(f"snapshot {name}: {p} does not load: {e!r}")
                snap.validated = True
        for name in [n for n, how in self.uncertain.items() if n not in present]:
            del self.uncertain[name]  # an interrupted mkdir that never happened, or an rmdir that did
        model.settle(live)
        return verified, nfiles, nsnaps

    # -- the run -----------------------------------------------------------------------

    def run(self) -> int:
        a = self.args
        print(f"crashtest: {a.cycles} cycles, seed {self.seed}, store {self.store}, work dir {self.work}", flush=True)
        if not (self.store / "cowfs-store.json").exists():
            if self.store.exists() and any(self.store.iterdir()):
                raise HarnessError(f"{self.store} exists and is not empty (give a new or empty directory)")
            r = self.cowfs("init", str(self.store), "--segment-size", a.segment_size, "--device", a.device)
            if r.returncode != 0:
                raise HarnessError(f"cowfs init failed: {r.stderr.strip()}")
        else:
            raise HarnessError(f"{self.store} is already a store: the harness needs a fresh one (it expires history)")
        t_start = time.monotonic()
        recovered = 0
        self.next_writer = None
        self.mount()
        (self.mnt / RUN).mkdir()
        for cycle in range(a.cycles):
            ok, line, problems = self.run_cycle(cycle)
            print(line, flush=True)
            for p in problems:
                print("    " + p.replace("\n", "\n    "), flush=True)
            if problems:
                print(f"    writer log: {self.logs / f'writer-{cycle:03d}.jsonl'}, daemon log: {self.store / 'cowfs.log'}",
                      flush=True)
            recovered += ok
            if not ok and a.stop_on_failure:
                break
        # a clean unmount at the end, and a last fsck
        final_ok = True
        r = self.cowfs("umount", str(self.mnt), timeout=120)
        if r.returncode != 0:
            print(f"final cowfs umount failed: {r.stderr.strip()}", flush=True)
            final_ok = False
        else:
            self.daemon_pid = None
        r = self.cowfs("fsck", str(self.store))
        if r.returncode != 0:
            print(f"final fsck failed:\n{r.stdout}{r.stderr}", flush=True)
            final_ok = False
        r = self.cowfs("stats", str(self.store), "--json")
        stats = json.loads(r.stdout) if r.returncode == 0 else {}
        T = self.totals
        at_kill = ", ".join(f"{k} {v}" for k, v in sorted(T["writer_at_kill"].items(), key=lambda kv: -kv[1]))
        print(f"kills: {T['kills']} (writer: {at_kill}; {T['in_snapshot_mkdir']} during a snapshot mkdir)", flush=True)
        print(f"verified: {human(T['bytes'])} ({T['bytes']} bytes): {T['files']} live files, {T['snapshots']} snapshot "
              f"checks, {T['history_versions']} versions from history, {T['closed']} closes reported by the writer", flush=True)
        print(f"gc: {T['gc_runs']} runs, {human(T['gc_freed'])} freed; {T['expired']} history rows expired; store "
              + (f"{human(stats.get('physical_bytes', 0))} physical, dedup {stats.get('dedup_ratio', 0):.2f}" if stats else "?"),
              flush=True)
        total = a.cycles
        print(f"{recovered}/{total} recovered ({T['kills']} kills, {human(T['bytes'])} verified) "
              f"in {time.monotonic() - t_start:.1f}s (seed {self.seed})"
              + ("" if final_ok else "; final unmount/fsck FAILED"), flush=True)
        return 0 if recovered == total and final_ok else 1


def writer_phase(r: dict | None) -> str:
    if r is None:
        return "starting"
    return {
        "ready": "starting", "started": "starting", "begin": "mid-write", "closing": "closing", "closed": "just closed",
        "rename_begin": "mid-rename", "renamed": "just renamed", "mkdir_begin": "mid-mkdir",
        "mkdir_done": "just mkdir'ed", "rmtree_begin": "mid-rotation", "rmtree_done": "just rotated",
        "unlink_begin": "mid-unlink", "unlinked": "just unlinked",
    }.get(r["ev"], r["ev"])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_writer":
        return writer_main(argv[1:])
    if argv and argv[0] == "_inspect":
        return inspect_main(argv[1:])
    ap = argparse.ArgumentParser(description="kill -9 the cowfs daemon while checkpoints are saved; check recovery",
                                 epilog="example: python tools/crashtest.py --cycles 100 --seed 7")
    ap.add_argument("--cycles", type=int, required=True, help="number of kill/recover cycles")
    ap.add_argument("--seed", type=int, help="random seed (default: random, printed)")
    ap.add_argument("--store", help="store directory: must not exist or be empty (default: in the work dir)")
    ap.add_argument("--workdir", help="directory for the mountpoint, logs (and store); never removed")
    ap.add_argument("--keep", action="store_true", help="keep the temporary work dir (store, logs) after success")
    ap.add_argument("--device", default="file", choices=("file", "pmem"))
    ap.add_argument("--segment-size", default="4M", help="small segments: rotations happen during the run")
    ap.add_argument("--max-snapshots", type=int, default=6, help="older snapshots are deleted (rmdir) beyond this")
    ap.add_argument("--max-run", type=float, default=3.0, help="longest writer run before the kill, seconds")
    ap.add_argument("--gc-prob", type=float, default=0.5, help="chance of a `cowfs gc` between cycles")
    ap.add_argument("--stop-on-failure", action="store_true")
    ap.add_argument("--overwrite-safetensors", action="store_true",
                    help="also (d): safetensors save_file straight over run/model-direct.safetensors each step")
    args = ap.parse_args(argv)
    if args.cycles < 1:
        ap.error("--cycles must be at least 1")
    try:
        import cowfs  # noqa: F401
    except ImportError:
        print("crashtest: cowfs is not importable: run it with the venv's python (.venv/bin/python)", file=sys.stderr)
        return 2

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    h = Harness(args)
    code = 1
    try:
        code = h.run()
    except KeyboardInterrupt:
        print("crashtest: interrupted; cleaning up", flush=True)
        code = 130
    except HarnessError as e:
        print(f"crashtest: harness error: {e}", flush=True)
        code = 2
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        code = 2
    finally:
        try:
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not skip the cleanup
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            h.cleanup()
        finally:
            signal.signal(signal.SIGINT, signal.default_int_handler)
    if code == 0 and h.own_work and not args.keep:
        shutil.rmtree(h.work, ignore_errors=True)
    else:
        print(f"crashtest: store and logs kept in {h.work}" + (f" (store {h.store})" if args.store else ""), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
