#!/usr/bin/env python3
"""Load test (issue 5): many processes save and read checkpoints through one mount while
snapshots come and go and gc runs; every byte read back is checked.

    python tools/loadtest.py [--procs 8] [--seconds 30] [--seed S] [--max-checkpoints N]
                             [--workdir DIR] [--keep]

It inits a store, mounts it, and forks --procs writer processes. Each writer owns the
directory MNT/wN/ and, until --seconds have passed or it has written --max-checkpoints
checkpoints, picks one operation at a time at random:

* torch.save of a varied state dict (dtypes from bool to float64, 0-d, empty and strided
  tensors, a frozen part that dedups) over model-K.pt: an in-place O_TRUNC rewrite;
* safetensors save_file to a temporary name, then os.replace onto weights-K.safetensors;
  or save_file straight over the target (safetensors' own temp + rename before close);
* an HF-style ckpt-N/ directory (model.safetensors, optimizer.pt, trainer_state.json),
  rotated to keep the newest 2 (rmtree);
* in-place patches of state-K.bin (pwrite at random offsets, also past the end), appends
  to it or to train.log, and deletions of any of these files;
* reads: of its own files, of other writers' committed files, and of recorded snapshots.

Before a writer opens a file it records the sha256 of the bytes it is about to write in its
journal (WORKDIR/journal-wN.jsonl, not on the mount); after close() it re-reads the whole file
and compares. A read of another writer's file must give one of the versions that writer began
(never torn, never foreign). That holds for every read whose open comes after the writer's
open; a read opened *before* an in-place rewrite may see the writer's bytes, as on ext4 (see
docs/design.md), so readers hold a shared flock (on WORKDIR/locks) from open to close and
writers hold it exclusively around their open() only.

Meanwhile the controller (two threads of this process) takes snapshots (alternately
`cowfs snapshot create` and mkdir in .snapshots), hashes every file in each one right away
(each must be a version its writer began, or an empty file being created), deletes the oldest
beyond --keep-snapshots (rmdir, `cowfs snapshot delete` or `cowfs prune --keep-last`, at
random), and every --gc-every seconds runs `cowfs gc` on the mountpoint or on the store.

When every writer has stopped: a final snapshot, the live tree through the mount must equal
every writer's last committed versions, a last gc, `cowfs umount`, `cowfs fsck` must be clean,
and (Store API, unmounted) every remaining snapshot must hold exactly the bytes recorded when
it was taken, and the live tree every writer's last versions.

Prints one line, e.g.
    load: 8 procs, 412 checkpoints written, 1.9 GiB verified, 37 snapshots, 9 gc runs, 0 errors, fsck clean
after the errors (if any, one per line on stderr), and exits 1 on any error. It stops by
itself, also on Ctrl-C or SIGTERM, and always unmounts; it ends only processes it started.
Without --workdir everything lives in a temporary directory removed after a clean run
(kept with --keep or on failure).
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import io
import json
import multiprocessing
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from cowfs.units import human_bytes
from harnessutil import sha_file

EMPTY = hashlib.sha256(b"").hexdigest()
MiB = 1 << 20
KEEP_CKPT_DIRS = 2
MAX_BLOB = 2 * MiB
WRITE_OPS = ("torch_save", "safetensors_rename", "safetensors_direct", "checkpoint_dir", "patch", "append")
OP_WEIGHTS = {
    "torch_save": 20, "safetensors_rename": 12, "safetensors_direct": 6, "checkpoint_dir": 8, "patch": 10,
    "append": 10, "delete": 5, "verify_own": 8, "read_other": 13, "read_snapshot": 8,
}


class LoadError(Exception):
    """A check failed: the message says what was read and what was expected."""


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def cowfs(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run the cowfs CLI; a non-zero exit is a LoadError with its message."""
    r = subprocess.run([sys.executable, "-m", "cowfs.cli", *args], capture_output=True, text=True,
                       timeout=timeout, stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        raise LoadError(f"cowfs {' '.join(args)} exited {r.returncode}: {r.stderr.strip() or r.stdout.strip()}")
    return r


# ===================================================================================
# journals: what each writer did, and which snapshots exist (JSON lines, not on the mount)
# ===================================================================================

class Journal:
    def __init__(self, path: Path) -> None:
        self.f = open(path, "a", buffering=1)  # line-buffered: every record reaches the file whole

    def rec(self, ev: str, **kw: Any) -> None:
        self.f.write(json.dumps({"ev": ev, **kw}) + "\n")

    def close(self) -> None:
        self.f.close()


class JournalTail:
    """Reads another process's journal incrementally (complete lines only)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.partial = b""

    def new_records(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self.offset += len(data)
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()
        return [json.loads(line) for line in lines if line]


class WriterView(JournalTail):
    """A writer's journal so far: every version it began per path, what is committed now."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.begun: dict[str, set[str]] = defaultdict(set)
        self.empty_ok: set[str] = set()  # created by open(): empty until the first close
        self.current: dict[str, str] = {}
        self.gone: Counter[str] = Counter()

    def refresh(self) -> "WriterView":
        for r in self.new_records():
            path = r["path"]
            if r["ev"] == "begin":
                self.begun[path].add(r["sha"])
                if r["empty_ok"]:
                    self.empty_ok.add(path)
            elif r["ev"] == "commit":
                self.current[path] = r["sha"]
            elif r["ev"] == "gone":
                self.current.pop(path, None)
                self.gone[path] += 1
        return self

    def allowed(self, path: str) -> set[str]:
        """The contents `path` may show: a version begun for it, or empty while being created.
        safetensors' own `.tmp<random>` siblings are renamed away before their close, so they
        only ever show their empty create-version."""
        ok = set(self.begun.get(path, ()))
        if path in self.empty_ok:
            ok.add(EMPTY)
        if not ok and os.path.basename(path).startswith(".tmp"):
            ok.add(EMPTY)
        return ok


class SnapshotView(JournalTail):
    """The controller's snapshot journal: recorded contents, and snapshots being deleted."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.files: dict[str, dict[str, str]] = {}
        self.deleting: set[str] = set()

    def refresh(self) -> "SnapshotView":
        for r in self.new_records():
            if r["ev"] == "snap":
                self.files[r["name"]] = r["files"]
            elif r["ev"] == "deleting":
                self.deleting.add(r["name"])
        return self


class PathLocks:
    """flock per (writer, path): readers hold it shared from open to close, writers
    exclusively around open(), so no read is open when an in-place rewrite opens."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @contextlib.contextmanager
    def hold(self, writer: int, rel: str, exclusive: bool) -> Iterator[None]:
        d = self.root / f"w{writer}"
        d.mkdir(parents=True, exist_ok=True)
        fd = os.open(d / (rel.replace("/", "%") + ".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)


# ===================================================================================
# writer processes
# ===================================================================================

@dataclass(frozen=True)
class WriterConfig:
    idx: int
    procs: int
    mnt: Path
    workdir: Path
    seed: int
    deadline: float  # time.monotonic()
    max_checkpoints: int


class Model:
    """A state dict that changes a little every step: a frozen part (dedups across saves),
    a trained part, and a few extra tensors of random dtype and shape."""

    def __init__(self, rng: random.Random) -> None:
        import torch

        self.torch = torch
        self.rng = rng
        self.gen = torch.Generator().manual_seed(rng.randrange(1 << 31))
        self.frozen = {f"encoder.{i}.weight": torch.randn(256, 128, generator=self.gen) for i in range(3)}
        self.trained = {
            "decoder.0.weight": torch.randn(128, 256, generator=self.gen),
            "decoder.0.bias": torch.randn(256, generator=self.gen).to(torch.bfloat16),
            "head.weight": torch.randn(64, 128, generator=self.gen).to(torch.float16),
            "embed.ids": torch.randint(0, 50_000, (4096,), generator=self.gen),
        }
        self.step = 0

    def random_tensor(self) -> Any:
        torch = self.torch
        dtype = self.rng.choice([torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64,
                                 torch.int32, torch.int8, torch.uint8, torch.bool])
        n = self.rng.choice([0, 1, self.rng.randint(2, 64), self.rng.randint(1000, 40_000)])
        shape: tuple[int, ...] = () if n == 1 and self.rng.random() < 0.5 else (n,)
        if n > 64 and self.rng.random() < 0.5:
            shape = (n // 8, 8)
        if dtype.is_floating_point:
            return torch.randn(shape, generator=self.gen).to(dtype)
        if dtype == torch.bool:
            return torch.randint(0, 2, shape, generator=self.gen).bool()
        low = 0 if dtype == torch.uint8 else -100
        return torch.randint(low, 100, shape, generator=self.gen).to(dtype)

    def next(self) -> dict[str, Any]:
        torch = self.torch
        self.step += 1
        for k, v in self.trained.items():
            if v.dtype.is_floating_point:
                self.trained[k] = (v.float() + 0.01 * torch.randn(v.shape, generator=self.gen)).to(v.dtype)
            else:
                self.trained[k] = torch.randint(0, 50_000, v.shape, generator=self.gen)
        sd = {**self.frozen, **self.trained, "step": torch.tensor(self.step)}
        for i in range(self.rng.randint(0, 3)):
            sd[f"extra.{i}"] = self.random_tensor()
        return sd

    def tensors(self) -> dict[str, Any]:
        """For safetensors: contiguous tensors that share no storage."""
        return {k: v.contiguous().clone() for k, v in self.next().items()}


class Writer:
    def __init__(self, cfg: WriterConfig) -> None:
        import torch
        from safetensors.torch import save as st_save
        from safetensors.torch import save_file as st_save_file

        torch.set_num_threads(1)
        self.torch = torch
        self.st_save = st_save
        self.st_save_file = st_save_file
        self.cfg = cfg
        self.root = cfg.mnt / f"w{cfg.idx}"
        self.rng = random.Random(cfg.seed * 1009 + cfg.idx)
        self.model = Model(self.rng)
        self.journal = Journal(cfg.workdir / f"journal-w{cfg.idx}.jsonl")
        self.others = {j: WriterView(cfg.workdir / f"journal-w{j}.jsonl") for j in range(cfg.procs) if j != cfg.idx}
        self.snaps = SnapshotView(cfg.workdir / "snapshots.jsonl")
        self.locks = PathLocks(cfg.workdir / "locks")
        self.files: dict[str, str] = {}  # path under wN/ -> sha256 of its committed version
        self.sizes: dict[str, int] = {}
        self.blobs: dict[str, bytes] = {}  # contents of state-K.bin and train.log (changed in place)
        self.ckpt_dirs: list[str] = []
        self.seq = 0
        self.stats: Counter[str] = Counter()

    # -- primitives ------------------------------------------------------------------

    def tag(self, rel: str) -> str:
        return f"w{self.cfg.idx}/{rel}"

    def begin(self, rel: str, digest: str, empty_ok: bool) -> None:
        self.journal.rec("begin", path=rel, sha=digest, empty_ok=empty_ok)

    def committed(self, rel: str, digest: str, size: int) -> None:
        self.journal.rec("commit", path=rel, sha=digest)
        self.files[rel] = digest
        self.sizes[rel] = size
        self.verify(rel, "read back after close")

    def gone(self, rel: str) -> None:
        self.journal.rec("gone", path=rel)
        self.files.pop(rel, None)
        self.sizes.pop(rel, None)
        self.blobs.pop(rel, None)

    def verify(self, rel: str, when: str) -> None:
        got, n = sha_file(self.root / rel)
        self.stats["bytes_verified"] += n
        if got != self.files[rel]:
            raise LoadError(f"{self.tag(rel)}: {when}: {n} bytes with sha256 {got[:16]}, expected "
                            f"{self.sizes[rel]} bytes with sha256 {self.files[rel][:16]}")

    def write_file(self, rel: str, data: bytes, mode: str, write: Callable[[Any], None]) -> None:
        """One new version of `rel` through our own open(): `write(f)` must leave exactly `data`."""
        existed = rel in self.files
        digest = sha(data)
        self.begin(rel, digest, empty_ok=not existed)
        with self.locks.hold(self.cfg.idx, rel, exclusive=True):
            f = open(self.root / rel, mode)  # buffered: a short write is retried, not lost
        with f:
            write(f)
        self.committed(rel, digest, len(data))

    def torch_bytes(self, obj: Any) -> bytes:
        buf = io.BytesIO()
        self.torch.save(obj, buf)
        return buf.getvalue()

    def save_torch(self, rel: str, obj: Any) -> None:
        data = self.torch_bytes(obj)
        self.write_file(rel, data, "wb", lambda f: self.torch.save(obj, f))

    def save_safetensors(self, rel: str, tensors: dict[str, Any], meta: dict[str, str], empty_ok: bool) -> None:
        data = self.st_save(tensors, metadata=meta)
        digest = sha(data)
        self.begin(rel, digest, empty_ok=empty_ok)
        self.st_save_file(tensors, str(self.root / rel), metadata=meta)
        self.committed(rel, digest, len(data))

    def check_torch_load(self, rel: str, obj: dict[str, Any]) -> None:
        loaded = self.torch.load(self.root / rel, weights_only=True, mmap=self.rng.random() < 0.5)
        want = obj["model"]
        got = loaded["model"]
        if loaded["step"] != obj["step"] or set(got) != set(want) or not all(
                got[k].dtype == want[k].dtype and self.torch.equal(got[k], want[k]) for k in want):
            raise LoadError(f"{self.tag(rel)}: torch.load gives other tensors than were saved")

    def check_safe_open(self, rel: str, tensors: dict[str, Any]) -> None:
        from safetensors import safe_open

        with safe_open(str(self.root / rel), framework="pt") as f:  # mmap of the file
            if set(f.keys()) != set(tensors) or not all(self.torch.equal(f.get_tensor(k), v) for k, v in tensors.items()):
                raise LoadError(f"{self.tag(rel)}: safe_open gives other tensors than were saved")

    # -- operations --------------------------------------------------------------------

    def op_torch_save(self) -> None:
        rel = f"model-{self.rng.randrange(2)}.pt"
        sd = self.model.next()
        if self.rng.random() < 0.3:
            sd["strided"] = sd["encoder.0.weight"][::3, 1::2]  # a view: torch.save writes its whole storage
        obj = {"model": sd, "step": self.model.step, "meta": {"lr": 3e-4 / self.model.step, "run": f"w{self.cfg.idx}"}}
        self.save_torch(rel, obj)
        if self.rng.random() < 0.25:
            self.check_torch_load(rel, obj)

    def op_safetensors_rename(self) -> None:
        k = self.rng.randrange(2)
        rel = f"weights-{k}.safetensors"
        tmp = f".tmp-{self.seq}-weights-{k}.safetensors"
        self.seq += 1
        tensors = self.model.tensors()
        meta = {"step": str(self.model.step)}
        self.save_safetensors(tmp, tensors, meta, empty_ok=True)
        digest, size = self.files[tmp], self.sizes[tmp]
        self.begin(rel, digest, empty_ok=False)
        self.gone(tmp)
        os.replace(self.root / tmp, self.root / rel)
        self.committed(rel, digest, size)

    def op_safetensors_direct(self) -> None:
        rel = f"weights-{self.rng.randrange(2)}.safetensors"
        tensors = self.model.tensors()
        self.save_safetensors(rel, tensors, {"step": str(self.model.step)}, empty_ok=rel not in self.files)
        if self.rng.random() < 0.25:
            self.check_safe_open(rel, tensors)

    def op_checkpoint_dir(self) -> None:
        d = f"ckpt-{self.model.step + 1:05d}"
        os.mkdir(self.root / d)
        tensors = self.model.tensors()
        self.save_safetensors(f"{d}/model.safetensors", tensors, {"format": "pt"}, empty_ok=True)
        optim = {"state": {i: {"exp_avg": self.model.random_tensor(), "step": self.model.step} for i in range(3)},
                 "param_groups": [{"lr": 1e-3, "params": [0, 1, 2]}]}
        self.save_torch(f"{d}/optimizer.pt", optim)
        state = json.dumps({"global_step": self.model.step, "log_history": [{"step": self.model.step}]}, indent=2).encode()
        self.write_file(f"{d}/trainer_state.json", state, "wb", lambda f: f.write(state))
        self.ckpt_dirs.append(d)
        while len(self.ckpt_dirs) > KEEP_CKPT_DIRS:
            old = self.ckpt_dirs.pop(0)
            for rel in [r for r in self.files if r.startswith(old + "/")]:
                self.gone(rel)
            shutil.rmtree(self.root / old)

    def new_blob(self, rel: str) -> None:
        block = self.rng.randbytes(64 << 10)
        data = self.rng.randbytes(self.rng.randint(1, 16) << 16) + block * self.rng.randint(0, 4)
        self.write_file(rel, data, "wb", lambda f: f.write(data))  # create, or O_TRUNC rewrite
        self.blobs[rel] = data

    def op_patch(self) -> None:
        rel = f"state-{self.rng.randrange(2)}.bin"
        old = self.blobs.get(rel)
        if old is None or len(old) > MAX_BLOB:
            self.new_blob(rel)
            return
        new = bytearray(old)
        patches = []
        for _ in range(self.rng.randint(1, 4)):
            off = self.rng.randint(0, len(new) + (64 << 10))  # sometimes past the end: a hole
            piece = self.rng.randbytes(self.rng.randint(1, 256 << 10))
            if off > len(new):
                new.extend(bytes(off - len(new)))
            new[off:off + len(piece)] = piece
            patches.append((off, piece))

        def write(f: Any) -> None:
            for off, piece in patches:
                done = 0
                while done < len(piece):
                    done += os.pwrite(f.fileno(), piece[done:], off + done)

        data = bytes(new)
        self.write_file(rel, data, "r+b", write)
        self.blobs[rel] = data

    def op_append(self) -> None:
        rel = self.rng.choice(["train.log", "state-0.bin", "state-1.bin"])
        old = self.blobs.get(rel)
        if old is None or len(old) > MAX_BLOB:
            self.new_blob(rel)
            return
        if rel.endswith(".log"):
            extra = "".join(f"step {self.model.step} loss {self.rng.random():.6f}\n" for _ in range(self.rng.randint(1, 200))).encode()
        else:
            extra = self.rng.randbytes(self.rng.randint(1, 256 << 10))
        data = old + extra
        self.write_file(rel, data, "ab", lambda f: f.write(extra))
        self.blobs[rel] = data

    def op_delete(self) -> None:
        top = sorted(r for r in self.files if "/" not in r)
        if top:
            rel = self.rng.choice(top)
            self.gone(rel)
            os.remove(self.root / rel)

    def op_verify_own(self) -> None:
        if self.files:
            self.verify(self.rng.choice(sorted(self.files)), "re-read")

    def op_read_other(self) -> None:
        j = self.rng.choice(sorted(self.others))
        view = self.others[j].refresh()
        if not view.current:
            return
        rel = self.rng.choice(sorted(view.current))
        gone_before = view.gone[rel]
        path = self.cfg.mnt / f"w{j}" / rel
        try:
            with self.locks.hold(j, rel, exclusive=False):
                got, n = sha_file(path)
        except FileNotFoundError:
            if view.refresh().gone[rel] > gone_before:
                self.stats["reads_skipped"] += 1
                return
            raise LoadError(f"w{self.cfg.idx} reading w{j}/{rel}: no such file, but w{j} did not remove it") from None
        allowed = view.refresh().allowed(rel)
        if got not in allowed:
            raise LoadError(f"w{self.cfg.idx} reading w{j}/{rel}: {n} bytes with sha256 {got[:16]}, which is no "
                            f"version w{j} wrote ({len(allowed)} known)")
        self.stats["bytes_verified"] += n
        self.stats["reads_other"] += 1

    def op_read_snapshot(self) -> None:
        self.snaps.refresh()
        live = sorted(n for n in self.snaps.files if n not in self.snaps.deleting and self.snaps.files[n])
        if not live:
            return
        name = self.rng.choice(live)
        rel, want = self.rng.choice(sorted(self.snaps.files[name].items()))
        try:
            got, n = sha_file(self.cfg.mnt / ".snapshots" / name / rel)
        except FileNotFoundError:
            if name in self.snaps.refresh().deleting:
                self.stats["reads_skipped"] += 1
                return
            raise LoadError(f"w{self.cfg.idx} reading snapshot {name}/{rel}: no such file, but the snapshot "
                            f"was not deleted") from None
        if got != want:
            raise LoadError(f"w{self.cfg.idx} reading snapshot {name}/{rel}: {n} bytes with sha256 {got[:16]}, "
                            f"recorded {want[:16]} when it was taken")
        self.stats["bytes_verified"] += n
        self.stats["reads_snapshot"] += 1

    # -- loop --------------------------------------------------------------------------

    def run(self, stop: Any) -> None:
        names = list(OP_WEIGHTS)
        weights = [OP_WEIGHTS[n] for n in names]
        while (time.monotonic() < self.cfg.deadline and self.stats["checkpoints"] < self.cfg.max_checkpoints
               and not stop.is_set()):
            op = self.rng.choices(names, weights)[0]
            try:
                getattr(self, f"op_{op}")()
            except LoadError:
                raise
            except Exception as e:
                raise LoadError(f"w{self.cfg.idx}: {op} failed: {type(e).__name__}: {e}") from e
            self.stats[op] += 1
            if op in WRITE_OPS:
                self.stats["checkpoints"] += 1


def writer_process(cfg: WriterConfig, stop: Any) -> None:
    """Entry point of a forked writer: runs, then leaves WORKDIR/result-wN.json."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the harness stops us through `stop`
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    result: dict[str, Any] = {"errors": [], "files": {}, "stats": {}}
    w = None
    try:
        w = Writer(cfg)
        w.run(stop)
    except Exception as e:  # noqa: BLE001 - every error is reported by the harness
        result["errors"].append(str(e) if isinstance(e, LoadError) else f"w{cfg.idx}: {type(e).__name__}: {e}")
        with open(cfg.workdir / f"traceback-w{cfg.idx}.txt", "w") as f:
            traceback.print_exc(file=f)
    if w is not None:
        result["files"] = {w.tag(rel): digest for rel, digest in w.files.items()}
        result["stats"] = dict(w.stats)
        w.journal.close()
    tmp = cfg.workdir / f"result-w{cfg.idx}.json.tmp"
    tmp.write_text(json.dumps(result))
    os.replace(tmp, cfg.workdir / f"result-w{cfg.idx}.json")


# ===================================================================================
# controller: snapshots, deletions, gc and prune
# ===================================================================================

def tree_hashes(top: Path, threads: int = 4) -> tuple[dict[str, str], int]:
    """sha256 of every regular file under `top` (through the mount), and the bytes read.
    Several threads read at once: the mount serves them in parallel, and the controller
    gets its share of the CPU next to the writers."""
    paths: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames.sort()
        for name in sorted(filenames):
            p = Path(dirpath) / name
            if p.is_symlink() or not p.is_file():
                raise LoadError(f"{p}: not a regular file")
            paths.append(p)
    with ThreadPoolExecutor(threads) as pool:
        hashed = list(pool.map(sha_file, paths))
    out = {str(p.relative_to(top)): digest for p, (digest, _) in zip(paths, hashed)}
    return out, sum(n for _, n in hashed)


class Controller:
    """Two threads next to the writers: one takes, checks, records and deletes snapshots
    (and sometimes prunes), the other runs gc. Each action's failure is recorded, not fatal."""

    def __init__(self, store: Path, mnt: Path, workdir: Path, procs: int, rng: random.Random, keep: int,
                 snap_every: float, gc_every: float, max_snapshots: int, verbose: bool = False) -> None:
        self.store = store
        self.mnt = mnt
        self.rng = rng
        self.keep = keep
        self.snap_every = snap_every
        self.gc_every = gc_every
        self.max_snapshots = max_snapshots
        self.verbose = verbose
        self.journal = Journal(workdir / "snapshots.jsonl")
        self.writers = {j: WriterView(workdir / f"journal-w{j}.jsonl") for j in range(procs)}
        self.live: dict[str, dict[str, str]] = {}  # recorded snapshots that exist, oldest first
        self.created = 0
        self.gc_runs = 0  # by the gc thread
        self.prunes = 0  # by the snapshot thread (each runs gc too)
        self.bytes_verified = 0
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._snapshot_loop, name="snapshots"),
                        threading.Thread(target=self._gc_loop, name="gc")]

    # -- threads -------------------------------------------------------------------------

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def join(self) -> None:
        self.stop.set()
        for t in self.threads:
            if t.ident is not None:  # started
                t.join()

    def _snapshot_loop(self) -> None:
        while not self.stop.wait(self.snap_every) and self.created < self.max_snapshots:
            self.attempt("snapshot", self.snapshot)
            self.attempt("delete old snapshots", self.trim)

    def _gc_loop(self) -> None:
        while not self.stop.wait(self.gc_every):
            self.attempt("gc", self.gc)

    def attempt(self, what: str, fn: Callable[[], None]) -> None:
        start = time.monotonic()
        try:
            fn()
        except LoadError as e:
            self.errors.append(f"controller: {what}: {e}")
        except Exception as e:  # noqa: BLE001 - reported, the run goes on
            self.errors.append(f"controller: {what}: {type(e).__name__}: {e}")
        if self.verbose:
            print(f"controller: {what} took {time.monotonic() - start:.2f}s", flush=True)

    # -- actions -------------------------------------------------------------------------

    def snapshot(self, name: str | None = None) -> None:
        name = name or f"load-{self.created:04d}"
        via = "cowfs snapshot create" if self.created % 2 == 0 else "mkdir"
        if via == "mkdir":
            os.mkdir(self.mnt / ".snapshots" / name)
        else:
            cowfs("snapshot", "create", str(self.mnt), name)
        self.created += 1
        files, n = tree_hashes(self.mnt / ".snapshots" / name)
        self.bytes_verified += n
        self.check_versions(f"snapshot {name} (made by {via})", files)
        self.live[name] = files
        self.journal.rec("snap", name=name, files=files)

    def check_versions(self, what: str, files: dict[str, str]) -> None:
        """Every file must hold a version its writer began (or be empty while being created)."""
        for view in self.writers.values():
            view.refresh()
        for rel, digest in files.items():
            top, _, sub = rel.partition("/")
            j = int(top[1:]) if top.startswith("w") and top[1:].isdigit() else -1
            if j not in self.writers or not sub:
                raise LoadError(f"{what}: {rel}: a file no writer made")
            if digest not in self.writers[j].allowed(sub):
                raise LoadError(f"{what}: {rel} holds sha256 {digest[:16]}, which is no version w{j} wrote")

    def trim(self) -> None:
        """Delete the oldest snapshots beyond --keep-snapshots: rmdir, `cowfs snapshot delete`, or prune."""
        while len(self.live) > self.keep:
            how = self.rng.choice(("rmdir", "delete", "prune"))
            if how == "prune":
                self.prune(self.keep)
                continue
            name = next(iter(self.live))
            self.journal.rec("deleting", name=name)  # readers may see it vanish from now on
            if how == "rmdir":
                os.rmdir(self.mnt / ".snapshots" / name)
            else:
                cowfs("snapshot", "delete", str(self.mnt), name)
            del self.live[name]

    def prune(self, keep_last: int) -> None:
        doomed = list(self.live)[:-keep_last]
        for name in doomed:
            self.journal.rec("deleting", name=name)
        r = cowfs("prune", str(self.mnt), "--keep-last", str(keep_last), "--json")
        self.prunes += 1
        removed = [s["name"] for s in json.loads(r.stdout)["snapshots"] if not s["keep"]]
        for name in doomed:
            del self.live[name]
        if sorted(removed) != sorted(doomed):
            raise LoadError(f"prune --keep-last {keep_last} removed {removed}, expected {doomed}")

    def gc(self) -> None:
        cowfs("gc", str(self.mnt if self.gc_runs % 2 == 0 else self.store))
        self.gc_runs += 1

    def check_live_tree(self, expected: dict[str, str], skip: set[str]) -> None:
        """The live tree through the mount: exactly every writer's last committed versions."""
        got, n = tree_hashes(self.mnt)
        self.bytes_verified += n
        for problem in compare_trees(got, expected, skip):
            self.errors.append(f"live tree (mounted): {problem}")


def compare_trees(got: dict[str, str], want: dict[str, str], skip: set[str]) -> list[str]:
    """Differences between two path -> sha256 maps, ignoring the top directories in `skip`."""
    problems = []
    for rel in sorted(set(got) | set(want)):
        if rel.split("/", 1)[0] in skip:
            continue
        if rel not in got:
            problems.append(f"{rel} is missing (sha256 {want[rel][:16]} expected)")
        elif rel not in want:
            problems.append(f"{rel} should not exist (sha256 {got[rel][:16]})")
        elif got[rel] != want[rel]:
            problems.append(f"{rel} holds sha256 {got[rel][:16]}, expected {want[rel][:16]}")
    return problems


# ===================================================================================
# offline checks (unmounted, Store API)
# ===================================================================================

def store_tree_hashes(store: Any, gen: int | None) -> tuple[dict[str, str], int]:
    from cowfs.store import ROOT_INO

    out: dict[str, str] = {}
    total = 0
    stack = [(ROOT_INO, "")]
    while stack:
        ino, prefix = stack.pop()
        for raw, attr in store.readdir(ino, gen):
            rel = prefix + raw.decode(errors="surrogateescape")
            if attr.is_dir:
                stack.append((attr.ino, rel + "/"))
                continue
            if attr.is_symlink:
                raise LoadError(f"{rel}: a symlink nobody made")
            h = hashlib.sha256()
            with store.open_reader(attr.ino, gen) as reader:
                pos = 0
                while pos < attr.size:
                    piece = reader.read(pos, min(8 * MiB, attr.size - pos))
                    if not piece:
                        raise LoadError(f"{rel}: ends at {pos} of {attr.size} bytes")
                    h.update(piece)
                    pos += len(piece)
            out[rel] = h.hexdigest()
            total += attr.size
    return out, total


def verify_offline(store_path: Path, snapshots: dict[str, dict[str, str]], live: dict[str, str],
                   skip: set[str]) -> tuple[list[str], int]:
    from cowfs.store import Store

    errors: list[str] = []
    total = 0
    with Store.open(store_path) as store:
        existing = {s.name: s for s in store.snapshot_list()}
        if set(existing) != set(snapshots):
            errors.append(f"snapshots after unmount: {sorted(existing)}, expected {sorted(snapshots)}")
        for name, files in snapshots.items():
            if name not in existing:
                continue
            got, n = store_tree_hashes(store, existing[name].gen)
            total += n
            # a writer that failed may have left anything in snapshots taken after it failed;
            # what was recorded must still be there either way
            errors += [f"snapshot {name} after unmount: {p}" for p in compare_trees(got, files, set())]
        got, n = store_tree_hashes(store, None)
        total += n
        errors += [f"live tree after unmount: {p}" for p in compare_trees(got, live, skip)]
    return errors, total


# ===================================================================================
# the run
# ===================================================================================

@dataclass
class Outcome:
    checkpoints: int = 0
    bytes_verified: int = 0
    snapshots: int = 0
    gc_runs: int = 0
    fsck: str = "not run"


def start_writers(args: argparse.Namespace, mnt: Path, workdir: Path, deadline: float,
                  stop: Any) -> list[multiprocessing.Process]:
    import safetensors.torch  # noqa: F401 - imported before the fork, shared by every writer
    import torch  # noqa: F401

    ctx = multiprocessing.get_context("fork")
    procs = []
    for j in range(args.procs):
        (mnt / f"w{j}").mkdir()
        cfg = WriterConfig(j, args.procs, mnt, workdir, args.seed, deadline, args.max_checkpoints)
        p = ctx.Process(target=writer_process, args=(cfg, stop), name=f"loadtest-w{j}")
        p.start()
        procs.append(p)
    return procs


def stop_writers(procs: list[multiprocessing.Process], stop: Any, grace: float) -> list[str]:
    """Ask the writers to stop; SIGKILL (by pid) any still running after `grace` seconds."""
    stop.set()
    errors = []
    end = time.monotonic() + grace
    for p in procs:
        p.join(max(0.0, end - time.monotonic()))
        if p.is_alive():
            errors.append(f"writer {p.name} (pid {p.pid}) did not stop; killed")
            os.kill(p.pid, signal.SIGKILL)
            p.join(10)
    return errors


def collect_results(workdir: Path, procs: list[multiprocessing.Process], out: Outcome) -> tuple[list[str], dict[str, str], set[str]]:
    errors: list[str] = []
    files: dict[str, str] = {}
    failed: set[str] = set()
    for j, p in enumerate(procs):
        path = workdir / f"result-w{j}.json"
        if not path.exists():
            errors.append(f"w{j} left no result (exit code {p.exitcode})")
            failed.add(f"w{j}")
            continue
        r = json.loads(path.read_text())
        errors += r["errors"]
        if r["errors"]:
            failed.add(f"w{j}")  # its last version is unknown: its live files are not compared
        files.update(r["files"])
        out.checkpoints += r["stats"].get("checkpoints", 0)
        out.bytes_verified += r["stats"].get("bytes_verified", 0)
    return errors, files, failed


def unmount(store: Path, mnt: Path, daemon_pid: int) -> list[str]:
    from cowfs.mountinfo import mounted_cowfs, process_alive

    errors = []
    if str(mnt) in mounted_cowfs():
        try:
            cowfs("umount", str(mnt))
        except (LoadError, subprocess.TimeoutExpired) as e:
            errors.append(f"umount: {e}")
    if str(mnt) in mounted_cowfs():
        subprocess.run(["fusermount3", "-u", "-z", str(mnt)], capture_output=True)
    deadline = time.monotonic() + 30
    while process_alive(daemon_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if process_alive(daemon_pid):
        errors.append(f"the daemon (pid {daemon_pid}) still runs after umount; killed")
        os.kill(daemon_pid, signal.SIGKILL)
    return errors


def run(args: argparse.Namespace, workdir: Path) -> tuple[Outcome, list[str]]:
    store, mnt = workdir / "store", workdir / "mnt"
    out = Outcome()
    errors: list[str] = []
    cowfs("init", str(store), "--segment-size", "16M")
    mnt.mkdir()
    cowfs("mount", str(store), str(mnt))
    daemon_pid = int((store / "lock").read_text().strip())
    stop = multiprocessing.get_context("fork").Event()
    procs: list[multiprocessing.Process] = []
    ctl = Controller(store, mnt, workdir, args.procs, random.Random(args.seed), args.keep_snapshots,
                     args.snapshot_every, args.gc_every, args.max_snapshots, args.verbose)
    live: dict[str, str] = {}
    failed: set[str] = set()
    try:
        deadline = time.monotonic() + args.seconds
        procs = start_writers(args, mnt, workdir, deadline, stop)
        ctl.start()
        while any(p.is_alive() for p in procs) and time.monotonic() < deadline + args.grace:
            time.sleep(0.1)
        errors += stop_writers(procs, stop, grace=10)
        ctl.join()
        werrors, live, failed = collect_results(workdir, procs, out)
        errors += werrors
        ctl.attempt("final snapshot", lambda: ctl.snapshot("final"))
        ctl.attempt("live tree", lambda: ctl.check_live_tree(live, failed))
        ctl.attempt("final gc", ctl.gc)
    finally:
        if procs:
            errors += stop_writers(procs, stop, grace=10)
        ctl.join()
        errors += unmount(store, mnt, daemon_pid)
    errors += ctl.errors
    out.snapshots, out.gc_runs = ctl.created, ctl.gc_runs + ctl.prunes
    out.bytes_verified += ctl.bytes_verified
    r = subprocess.run([sys.executable, "-m", "cowfs.cli", "fsck", str(store), "--json"], capture_output=True, text=True,
                       stdin=subprocess.DEVNULL, timeout=600)
    clean = r.returncode == 0 and json.loads(r.stdout or "{}").get("clean") is True
    out.fsck = "fsck clean" if clean else f"fsck FAILED (exit {r.returncode})"
    if not clean:
        errors.append(f"cowfs fsck {store} exited {r.returncode}: {(r.stdout + r.stderr).strip()}")
    try:
        offline, n = verify_offline(store, ctl.live, live, failed)
        errors += offline
        out.bytes_verified += n
    except Exception as e:  # noqa: BLE001 - reported
        errors.append(f"verifying the unmounted store: {type(e).__name__}: {e}")
    return out, errors


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--procs", type=int, default=8, help="writer processes (default 8)")
    ap.add_argument("--seconds", type=float, default=30, help="how long the writers run (default 30)")
    ap.add_argument("--seed", type=int, default=None, help="random seed (default: random, printed)")
    ap.add_argument("--max-checkpoints", type=int, default=2000, help="per writer: stop after this many writes")
    ap.add_argument("--max-snapshots", type=int, default=1000, help="take at most this many snapshots")
    ap.add_argument("--keep-snapshots", type=int, default=3, help="delete the oldest beyond this many")
    ap.add_argument("--snapshot-every", type=float, default=0.5, metavar="SECONDS",
                    help="pause between the end of one snapshot's check and the next snapshot")
    ap.add_argument("--gc-every", type=float, default=4.0, metavar="SECONDS")
    ap.add_argument("--grace", type=float, default=120.0, metavar="SECONDS",
                    help="writers still running this long after --seconds are an error")
    ap.add_argument("--workdir", help="directory for the store, the mount and the journals (kept)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    ap.add_argument("--verbose", action="store_true", help="print what the controller does and how long it takes")
    args = ap.parse_args(argv)
    if args.procs < 2 or args.seconds <= 0 or args.max_checkpoints < 1 or args.keep_snapshots < 1:
        ap.error("need --procs >= 2, --seconds > 0, --max-checkpoints >= 1, --keep-snapshots >= 1")
    if args.seed is None:
        args.seed = random.randrange(1 << 31)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    workdir = Path(args.workdir).absolute() if args.workdir else Path(tempfile.mkdtemp(prefix="cowfs-load-"))
    workdir.mkdir(parents=True, exist_ok=True)

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    print(f"loadtest: seed {args.seed}, {args.procs} procs, {args.seconds:g} s, workdir {workdir}", flush=True)
    try:
        out, errors = run(args, workdir)
    except KeyboardInterrupt:
        print(f"loadtest: interrupted (seed {args.seed}); workdir {workdir}", file=sys.stderr)
        return 130
    except LoadError as e:
        print(f"loadtest: {e}", file=sys.stderr)
        return 1
    for e in errors:
        print(f"ERROR: {e}", file=sys.stderr)
    print(f"load: {args.procs} procs, {out.checkpoints} checkpoints written, {human_bytes(out.bytes_verified)} verified, "
          f"{out.snapshots} snapshots, {out.gc_runs} gc runs, {len(errors)} errors, {out.fsck}", flush=True)
    if errors:
        print(f"loadtest: FAILED (seed {args.seed}); journals and store in {workdir}", file=sys.stderr)
        return 1
    if not args.workdir and not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
