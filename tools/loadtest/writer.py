"""A writer process: saves, rewrites, patches, appends to and deletes its own files under
MNT/wN/, one random operation at a time, and checks every file it closes by reading it back.

`writer_process` is the target of a forked multiprocessing.Process; it leaves its
outcome in WORKDIR/result-wN.json for the harness.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import random
import shutil
import signal
import time
import traceback
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from tools.harnessutil import sha_file

from .errors import LoadError
from .journal import Journal, writer_journal_path
from .path_locks import PathLocks
from .peer_reads import PeerReader
from .state_dicts import EvolvingStateDict

MiB = 1 << 20
KEEP_CKPT_DIRS = 2
MAX_BLOB = 2 * MiB
WRITE_OPS = ("torch_save", "safetensors_rename", "safetensors_direct", "checkpoint_dir", "patch", "append")
OP_WEIGHTS = {
    "torch_save": 20, "safetensors_rename": 12, "safetensors_direct": 6, "checkpoint_dir": 8, "patch": 10,
    "append": 10, "delete": 5, "verify_own": 8, "read_other": 13, "read_snapshot": 8,
}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class WriterConfig:
    idx: int
    procs: int
    mnt: Path
    workdir: Path
    seed: int
    deadline: float  # time.monotonic()
    max_checkpoints: int


def result_path(workdir: Path, writer: int) -> Path:
    """Where writer `writer` leaves {"errors", "files", "stats"} when it ends."""
    return workdir / f"result-w{writer}.json"


class Writer:
    """One writer's files under MNT/wN/: what it committed last (files, sizes, the bytes of
    the files it changes in place), and the operations that change them."""

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
        self.state_dicts = EvolvingStateDict(self.rng)
        self.journal = Journal(writer_journal_path(cfg.workdir, cfg.idx))
        self.stats: Counter[str] = Counter()
        self.locks = PathLocks(cfg.workdir / "locks")
        self.peers = PeerReader(cfg.idx, cfg.procs, cfg.mnt, cfg.workdir, self.rng, self.locks, self.stats)
        self.files: dict[str, str] = {}  # path under wN/ -> sha256 of its committed version
        self.sizes: dict[str, int] = {}
        self.blobs: dict[str, bytes] = {}  # contents of state-K.bin and train.log (changed in place)
        self.ckpt_dirs: list[str] = []
        self.seq = 0

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

    # -- operations (OP_WEIGHTS names them without the op_) ------------------------------

    def op_torch_save(self) -> None:
        rel = f"model-{self.rng.randrange(2)}.pt"
        sd = self.state_dicts.next()
        if self.rng.random() < 0.3:
            sd["strided"] = sd["encoder.0.weight"][::3, 1::2]  # a view: torch.save writes its whole storage
        step = self.state_dicts.step
        obj = {"model": sd, "step": step, "meta": {"lr": 3e-4 / step, "run": f"w{self.cfg.idx}"}}
        self.save_torch(rel, obj)
        if self.rng.random() < 0.25:
            self.check_torch_load(rel, obj)

    def op_safetensors_rename(self) -> None:
        k = self.rng.randrange(2)
        rel = f"weights-{k}.safetensors"
        tmp = f".tmp-{self.seq}-weights-{k}.safetensors"
        self.seq += 1
        tensors = self.state_dicts.tensors()
        meta = {"step": str(self.state_dicts.step)}
        self.save_safetensors(tmp, tensors, meta, empty_ok=True)
        digest, size = self.files[tmp], self.sizes[tmp]
        self.begin(rel, digest, empty_ok=False)
        self.gone(tmp)
        os.replace(self.root / tmp, self.root / rel)
        self.committed(rel, digest, size)

    def op_safetensors_direct(self) -> None:
        rel = f"weights-{self.rng.randrange(2)}.safetensors"
        tensors = self.state_dicts.tensors()
        self.save_safetensors(rel, tensors, {"step": str(self.state_dicts.step)}, empty_ok=rel not in self.files)
        if self.rng.random() < 0.25:
            self.check_safe_open(rel, tensors)

    def op_checkpoint_dir(self) -> None:
        d = f"ckpt-{self.state_dicts.step + 1:05d}"
        os.mkdir(self.root / d)
        tensors = self.state_dicts.tensors()  # one step on: the step of this checkpoint
        step = self.state_dicts.step
        self.save_safetensors(f"{d}/model.safetensors", tensors, {"format": "pt"}, empty_ok=True)
        optim = {"state": {i: {"exp_avg": self.state_dicts.random_tensor(), "step": step} for i in range(3)},
                 "param_groups": [{"lr": 1e-3, "params": [0, 1, 2]}]}
        self.save_torch(f"{d}/optimizer.pt", optim)
        state = json.dumps({"global_step": step, "log_history": [{"step": step}]}, indent=2).encode()
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
            step = self.state_dicts.step
            extra = "".join(f"step {step} loss {self.rng.random():.6f}\n" for _ in range(self.rng.randint(1, 200))).encode()
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
        self.peers.read_other()

    def op_read_snapshot(self) -> None:
        self.peers.read_snapshot()

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
    done = result_path(cfg.workdir, cfg.idx)
    tmp = done.with_name(done.name + ".tmp")
    tmp.write_text(json.dumps(result))
    os.replace(tmp, done)
