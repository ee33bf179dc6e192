#!/usr/bin/env python3
"""Crash test: kill -9 the mount daemon while real checkpoints are being saved, then check.

    python tools/crashtest.py --cycles N [--seed S] [--store DIR] [--keep]

Each cycle:

1. A writer process saves real checkpoints in a loop into the mount (MNT/run/), the way
   training code does: (a) torch.save of a ~3 MB model state dict (half of it frozen, so
   chunks dedup) over a fixed `model.pt` (in-place O_TRUNC rewrite; now and then first a
   rollback: one of the last 3 steps' weights again, the bytes of a maybe dead version),
   (b) safetensors save_file to a temporary name + os.replace onto `model.safetensors`,
   (c) an HF-style `checkpoint-N/` directory (model.safetensors, optimizer.pt,
   trainer_state.json last), rotated to keep the newest 2. Before it opens a file it logs
   a `begin` record with the sha256 of the bytes it is about to write; once close() has
   returned it logs `closed`. Records carry a CLOCK_MONOTONIC time and go to a JSON-lines
   file on a non-cowfs path (fsynced each) and to a pipe.
2. Meanwhile the harness takes snapshots (`mkdir MNT/.snapshots/NAME`), records the sha256
   of every file in each one right after the mkdir, and deletes the oldest ones (rmdir)
   beyond --max-snapshots. In some cycles (--mount-gc-prob, and always when the kill
   targets gc) it also sends the daemon `gc` and `prune --keep-name 'c[0-9]*-[0-9]*'
   --keep-history 0` requests (the requests `cowfs gc MNT` / `cowfs prune MNT ...` send):
   prune keeps every harness snapshot but drops the history no snapshot holds, so gc
   really punches and deletes segments while the writer runs.
3. At a random moment (a random delay, or a short random delay after a chosen writer
   event: a file open, a close, a rename, a rotation, a checkpoint mkdir; after a snapshot
   mkdir started; after an in-mount gc/prune request was sent, or after its first progress
   line, i.e. while it punches) it kills the daemon with SIGKILL (pid from STORE/lock),
   kills the writer, and lazily unmounts (fusermount3 -u -z). A daemon that was already
   dead, or that logged a warning or error, is a failure.
4. Unmounted: `cowfs fsck STORE` must exit 0. The history of every file closed in this
   cycle (Store API) must hold each closed version (new contents born in close order) and
   nothing but complete versions (no empty version that is not current). A closed version
   may be missing only if an in-mount prune that could have expired it ran after it was
   replaced and no surviving snapshot holds it. Closed versions not loaded otherwise are
   written out and loaded with torch / safetensors / json. History is expired (most
   cycles) and `cowfs gc` runs (some cycles).
5. Remounted: every path in the live tree must be in a state the writer's log allows (the
   last closed version, or, when the writer had begun the next one, that complete next
   version; a file being created may also be empty; nothing torn, nothing unknown; a rename
   is all or nothing), every non-empty live file must load (torch.load / safetensors
   load_file / json), and every retained snapshot must hold exactly the bytes recorded when
   it was taken. The first time, a snapshot must also match the writer's log at some moment
   while its mkdir ran: every path present or absent as the log allows then, each file the
   version it had then, renames all or nothing. A snapshot whose mkdir or rmdir the kill
   interrupted may exist or not; if it exists it is recorded (and checked) then.

With --overwrite-safetensors the writer also does (d): save_file straight over an existing
`model-direct.safetensors`. safetensors 0.8 writes a `.tmp<random>` sibling, renames it onto
the target and closes it only after the rename; the rename transaction keeps the previous
version until that close (design.md, "Replace-via-rename before close").

One line per cycle, then `K/N recovered`. Exit 0 only when every cycle recovered. The
harness kills only what it started, by pid (its writer and its mount's daemon), and
unmounts its mountpoint, also on Ctrl-C, SIGTERM or failure. Without --workdir/--store
everything lives in a temporary directory that is removed after a fully successful run
(kept with --keep or on failure).
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import math
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
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from cowfs.units import human_bytes
from cowfs.mountinfo import process_alive
from cowfs.store.layout import DEFAULT_DEVICE, DEVICES
from harnessutil import sha_file

EMPTY = hashlib.sha256(b"").hexdigest()
DIR = "DIR"
RUN = "run"  # the writer's directory under the mount root
KEEP_CHECKPOINTS = 2
SNAP_GLOB = "c[0-9]*-[0-9]*"  # matches every harness snapshot: an in-mount prune keeps them all
STALL = 5.0  # seconds without a writer record while the daemon lives: a hang (a step takes < 0.5 s)
MiB = 1 << 20


# ===================================================================================
# writer process (python tools/crashtest.py _writer ...)
# ===================================================================================

def writer_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="crashtest.py _writer")
    ap.add_argument("--root", required=True)  # MNT/run
    ap.add_argument("--log", required=True)  # JSON-lines file on a non-cowfs path
    ap.add_argument("--scratch", required=True)  # non-cowfs directory for the self-check
    ap.add_argument("--seed", type=int, required=True)
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
    go = sys.stdin.readline().split()  # "go STEP0" once its cycle starts
    if len(go) != 2 or go[0] != "go":
        return 0
    step0 = int(go[1])

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

    rec("started", step0=step0)
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
    step = step0
    recent: list[dict] = []  # copies of the last state dicts: a rollback saves one again
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

        # (a) in-place rewrite of a fixed path. Now and then first a rollback: an earlier step's
        # weights again, whose chunks may by now belong only to dead versions: the save dedups
        # against chunks an in-mount prune/gc may be deciding about
        if recent and rng.random() < 0.2:
            save_torch(root / "model.pt", rng.choice(recent), step)
        save_torch(root / "model.pt", sd, step)
        recent = (recent + [{k: v.clone() for k, v in sd.items()}])[-3:]
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
    """Read back every version in the history of each path closed this cycle. Reports what it
    found per path (the harness judges what is missing) and what must never be there; writes the
    bytes of the versions listed in spec["dump"] to files, for the harness to load."""
    spec = json.loads(Path(argv[0]).read_text())
    from cowfs.errors import NotFound
    from cowfs.store import Store
    from cowfs.store import namespace as ns

    out: dict[str, Any] = {"problems": [], "found": {}, "versions": 0, "bytes": 0, "expired": None}
    problems = out["problems"]
    dump: dict[str, str] = spec["dump"]  # sha -> file to write it to
    with Store.open(spec["store"]) as s:
        for path, closed in spec["closed"].items():
            allowed = set(spec["ever"][path])
            try:
                inos = s.catalog.read(lambda conn: ns.inodes_ever_at(conn, "/" + path))
            except NotFound:
                inos = []  # an in-mount prune dropped every name the path had
            births: dict[str, list[int]] = {}
            for ino in inos:
                for v in s.history(ino):
                    what = f"history of {path}: version born at gen {v.birth_gen}"
                    try:
                        with s.open_reader(ino, v.birth_gen) as reader:
                            data = reader.read(0, reader.size)
                    except Exception as e:  # noqa: BLE001 - reported
                        problems.append(f"{what} unreadable: {e!r}")
                        continue
                    digest = hashlib.sha256(data).hexdigest()
                    births.setdefault(digest, []).append(v.birth_gen)
                    out["versions"] += 1
                    out["bytes"] += len(data)
                    if digest not in allowed:
                        problems.append(f"{what} ({len(data)} bytes, sha {digest[:12]}) is no complete version "
                                        f"the writer wrote")
                    elif digest == EMPTY and v.death_gen is not None:
                        problems.append(f"{what} is empty and was replaced at gen {v.death_gen}: an empty "
                                        f"intermediate state (a create's empty body is not history)")
                    if digest in dump and not os.path.exists(dump[digest]):
                        Path(dump[digest]).write_bytes(data)
            out["found"][path] = sorted(births)
            gens = [min(births[d]) for d in spec["order"][path] if d in births]
            if any(b <= a for a, b in zip(gens, gens[1:])):
                problems.append(f"history of {path}: the closed versions are not born in close order "
                                f"(generations {gens} in close order)")
        if spec.get("expire"):
            out["expired"] = s.expire_history(0)
    print(json.dumps(out))
    return 0


# ===================================================================================
# harness
# ===================================================================================

class HarnessError(Exception):
    """A failure of the harness itself (not a finding about cowfs)."""


@dataclass
class Rename:
    """One os.replace of the writer, from its records (times are CLOCK_MONOTONIC)."""
    src: str
    dst: str
    dst_before: set  # states dst may have had before
    src_states: set  # states src may have had (and dst has after)
    t_begin: float
    t_src_closed: float  # src's last close returned: it exists from then until the rename
    t_done: float = math.inf  # the `renamed` record
    t_next: float = math.inf  # the next rename onto dst begins


class Model:
    """Which states each path may be in, from the writer's records. A state is DIR, a
    sha256 of the whole file, or None (absent)."""

    def __init__(self) -> None:
        self.allowed: dict[str, set] = {RUN: {DIR}}
        self.ever: dict[str, set] = {RUN: {DIR}}
        self.renames: list[Rename] = []  # since the last settle
        self.last_closed: dict[str, float] = {}  # path -> time of its last `closed` record
        self.what: dict[str, str] = {EMPTY: "empty (freshly created)"}  # sha -> description
        self.first_t: dict[str, float] = {}  # sha -> time of its first `begin`
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
            self.first_t.setdefault(r["sha"], r["t"])
            self._set(r["path"], new)
            self.how[r["path"]] = r["how"]
            if r["how"] == "save_file":
                d = os.path.dirname(r["path"])
                self.tmp_pending[d] = self.tmp_pending.get(d, 0) + 1
                self.tmp_dirs_ever.add(d)
        elif ev == "closed":
            self._set(r["path"], {r["sha"]})
            self.last_closed[r["path"]] = r["t"]
            if self.how.pop(r["path"], None) == "save_file":
                d = os.path.dirname(r["path"])
                self.tmp_pending[d] -= 1
                if not self.tmp_pending[d]:
                    del self.tmp_pending[d]
        elif ev == "rename_begin":
            src, dst = r["src"], r["dst"]
            for rn in self.renames:
                if rn.dst == dst and rn.t_next == math.inf:
                    rn.t_next = r["t"]
            self.renames.append(Rename(src, dst, set(self.get(dst)), set(self.get(src)), r["t"],
                                       self.last_closed.get(src, math.inf)))
            self._set(dst, self.get(dst) | self.get(src))
            self._set(src, self.get(src) | {None})
        elif ev == "renamed":
            for rn in self.renames:
                if (rn.src, rn.dst, rn.t_done) == (r["src"], r["dst"], math.inf):
                    self._set(rn.dst, rn.src_states)
                    self._set(rn.src, {None})
                    rn.t_done = r["t"]
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

    def replay(self, records: list[dict], windows: dict[str, tuple[float, float]]) -> dict[str, dict[str, set]]:
        """Apply a cycle's records in order. For each window (t1, t2), return path -> every state
        the path may have had at some moment within it (paths not listed: only absent).

        The model after the records stamped up to time t allows every state possible at t:
        `begin`-like records are stamped before the change, `closed`-like ones after it."""
        out: dict[str, dict[str, set]] = {name: {} for name in windows}
        taken: set[str] = set()

        def take(name: str) -> None:
            seen = out[name]
            for p in set(self.allowed) | set(seen):
                seen[p] = seen.get(p, {None} if name in taken else set()) | self.get(p)
            taken.add(name)

        for k in range(len(records) + 1):
            lo = records[k - 1]["t"] if k else -math.inf  # this model state holds from lo to hi
            hi = records[k]["t"] if k < len(records) else math.inf
            for name, (t1, t2) in windows.items():
                if lo <= t2 and hi > t1:
                    take(name)
            if k < len(records):
                self.apply(records[k])
        return out

    def rename_violation(self, rn: Rename, src_state: str | None, dst_state: str | None) -> str | None:
        """A state of (src, dst) that is no moment of the rename: it is all or nothing."""
        if src_state is not None and dst_state not in rn.dst_before:
            return (f"rename {rn.src} -> {rn.dst} half done: {rn.src} still exists but {rn.dst} is "
                    f"{self.describe(dst_state)}")
        if src_state is None and dst_state not in rn.src_states:
            return f"rename {rn.src} -> {rn.dst}: {rn.src} is gone but {rn.dst} is {self.describe(dst_state)}"
        return None

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
        self.renames.clear()

    def describe(self, state: str | None) -> str:
        if state is None:
            return "absent"
        if state == DIR:
            return "a directory"
        return f"{state[:12]} [{self.what.get(state, 'unknown content')}]"

    def describe_all(self, states: Iterable) -> str:
        return ", ".join(sorted(self.describe(s) for s in states))


def ends_at(r: dict, path: str) -> bool:
    """Does this writer record begin a change that can end the current version at `path`
    (replace it, rename it away or over it, delete it)?"""
    ev = r["ev"]
    return ((ev in ("begin", "unlink_begin") and r["path"] == path)
            or (ev == "rename_begin" and path in (r["src"], r["dst"]))
            or (ev == "rmtree_begin" and path.startswith(r["path"] + "/")))


class Snapshot:
    def __init__(self, name: str, cycle: int) -> None:
        self.name = name
        self.cycle = cycle
        self.files: dict[str, tuple[str, int]] | None = None  # rel path -> (sha or DIR, size)
        self.validated = False  # checked against the writer's log once


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


def proc_args(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().decode(errors="replace").split("\0")
    except OSError:
        return []


def mounted_at(mnt: Path) -> bool:
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split(" - ")[0].split()
            if len(fields) > 4 and fields[4].encode().decode("unicode_escape") == str(mnt):
                return True
    return False


class Writer:
    """One writer process, started ahead of its cycle (torch's import takes seconds)."""

    def __init__(self, h: "Harness", cycle: int, seed: int) -> None:
        self.cycle = cycle
        self.scratch = h.work / "scratch" / str(cycle)  # its own: the next writer starts beside it
        self.log = h.logs / f"writer-{cycle:03d}.jsonl"
        self.errpath = h.logs / f"writer-{cycle:03d}.err"
        self.records: list[tuple[float, dict]] = []  # as received on the pipe
        self.listeners: list[Callable[[dict], None]] = []
        self.ready = threading.Event()
        self.lock = threading.Lock()
        self.err = open(self.errpath, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "_writer", "--root", str(h.mnt / RUN), "--log", str(self.log),
             "--scratch", str(self.scratch), "--seed", str(seed), "--ppid", str(os.getpid())]
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

    def go(self, step0: int) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"go {step0}\n".encode())
        self.proc.stdin.flush()

    def last_record(self) -> dict | None:
        with self.lock:
            return self.records[-1][1] if self.records else None

    def last_receipt(self) -> float:
        with self.lock:
            return self.records[-1][0] if self.records else 0.0

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            raise HarnessError(f"writer pid {self.proc.pid} did not die after SIGKILL within 30 s "
                               f"(stuck in the kernel: {Path(f'/proc/{self.proc.pid}/wchan').read_text()})")
        self.reader.join(timeout=10)
        shutil.rmtree(self.scratch, ignore_errors=True)
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


@dataclass
class Target:
    """What the kill fires on: `kind` time | event | snapshot | gc | gc-punch."""
    kind: str
    event: str | None
    nth: int
    delay: float

    def describe(self) -> str:
        return self.kind if self.kind != "event" else f"{self.event}#{self.nth}"


TARGETS = [  # (weight, kind, event, max nth, max delay in s)
    (26, "time", None, 0, 0.0),
    (13, "event", "begin", 10, 0.080),      # mid-write (data still in the kernel's cache or in the daemon)
    (13, "event", "closing", 6, 0.020),     # close() under way: inside the commit
    (5, "event", "closed", 6, 0.002),       # right after a close returned
    (10, "event", "rename_begin", 3, 0.003),
    (11, "snapshot", None, 2, 0.006),       # during a snapshot mkdir
    (8, "event", "rmtree_begin", 2, 0.006),  # checkpoint rotation
    (6, "event", "mkdir_begin", 3, 0.003),
    (8, "gc", None, 2, 0.060),              # after an in-mount gc/prune request was sent: expiry, gc's decision
    (6, "gc-punch", None, 1, 0.004),        # after its first progress line: gc punches and deletes segments
]


@dataclass
class GcRequest:
    """One in-mount gc or prune request, as the harness saw it (times: CLOCK_MONOTONIC)."""
    n: int
    op: str  # "gc" or "prune"
    t_sent: float
    progress: tuple[int, int] | None = None  # the last progress line
    t_done: float | None = None  # its answer arrived
    result: dict | None = None
    error: str | None = None
    killed_in: str | None = None  # its phase when the kill fired, if it was under way

    def phase(self) -> str:
        if self.progress is None:
            return "expiring/deciding" if self.op == "prune" else "deciding"
        return "punching" if self.progress[0] < self.progress[1] else "deleting segments"

    def freed(self) -> int:
        g = (self.result or {}).get("gc") if self.op == "prune" else self.result
        return g["bytes_freed"] if g else 0

    def note(self) -> str:
        if self.result is None:
            return f"{self.op} killed {self.killed_in}" if self.killed_in else f"{self.op} failed"
        rows = f", {self.result['history_rows_dropped']} rows dropped" if self.op == "prune" else ""
        return f"{self.op} {human_bytes(self.freed())} freed{rows}"


class Cycle:
    """One cycle's run: filled in by the threads that drive it, read by the checks."""

    def __init__(self, index: int, seed: int, writer: "Writer", target: Target) -> None:
        self.index = index
        self.seed = seed
        self.writer = writer
        self.target = target
        self.fired = threading.Event()
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.t_go = self.t_kill = 0.0
        self.reason = ""
        self.early_exit: int | None = None
        self.writer_at_kill: dict | None = None
        self.snap = "idle"  # what the snapshot thread is doing
        self.snap_at_kill = "idle"
        self.gc_at_kill: GcRequest | None = None
        self.errors: list[str] = []  # seen while the daemon was alive
        self.snap_windows: dict[str, list[float]] = {}  # name -> [mkdir started, mkdir returned (inf: not)]
        self.gc_requests: list[GcRequest] = []
        self.records: list[dict] = []  # the writer's durable log
        self.snap_states: dict[str, dict[str, set]] = {}  # name -> what the log allows during its mkdir
        self.renames: list[Rename] = []

    def killed_in_gc(self) -> GcRequest | None:
        q = self.gc_at_kill
        return q if q is not None and q.result is None else None


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
        self.log_pos = 0  # where this mount's lines start in STORE/cowfs.log
        self.writer: Writer | None = None
        self.next_writer: Writer | None = None
        self.next_step = 0
        self.loaded: set[str] = set()  # shas already loaded with torch/safetensors/json
        self.totals: dict[str, Any] = {
            "kills": 0, "bytes": 0, "files": 0, "closed": 0, "snapshots": 0, "history_versions": 0,
            "writer_at_kill": {}, "in_snapshot_mkdir": 0, "in_gc": {}, "gc_runs": 0, "gc_freed": 0, "expired": 0,
            "mount_gc_cycles": 0, "mount_gc": {"gc": 0, "prune": 0}, "mount_gc_answered": 0, "mount_gc_freed": 0,
            "mount_gc_rows": 0, "expired_by_prune": 0, "loaded_from_history": 0}

    # -- processes we start ----------------------------------------------------------

    def cowfs(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "cowfs.cli", *args], capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)

    def mount(self) -> None:
        log = self.store / "cowfs.log"
        self.log_pos = log.stat().st_size if log.exists() else 0
        r = self.cowfs("mount", str(self.store), str(self.mnt), timeout=120)
        if r.returncode != 0:
            raise HarnessError(f"cowfs mount failed ({r.returncode}): {r.stderr.strip()}")
        m = re.search(r"daemon pid (\d+)", r.stdout)
        lock_pid = (self.store / "lock").read_text().strip()
        if not m or not lock_pid.isdigit() or int(lock_pid) != int(m.group(1)):
            raise HarnessError(f"daemon pid unclear: mount said {r.stdout.strip()!r}, STORE/lock holds {lock_pid!r}")
        self.daemon_pid = int(lock_pid)
        if not self.ours(self.daemon_pid):
            raise HarnessError(f"pid {self.daemon_pid} is not the daemon of {self.store} on {self.mnt}: "
                               f"{proc_args(self.daemon_pid)}")

    def ours(self, pid: int) -> bool:
        """Is pid (still) the daemon this harness mounted? (guards against pid reuse)"""
        args = proc_args(pid)
        return str(self.store) in args and str(self.mnt) in args

    def daemon_alive(self) -> bool:
        return self.daemon_pid is not None and process_alive(self.daemon_pid) and self.ours(self.daemon_pid)

    def kill_daemon(self) -> None:
        if self.daemon_alive():
            os.kill(self.daemon_pid, signal.SIGKILL)  # type: ignore[arg-type]

    def wait_daemon_gone(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while self.daemon_pid is not None and process_alive(self.daemon_pid):  # not ours(): an exiting
            # process has no cmdline any more but may still hold the store's lock and /dev/fuse
            if time.monotonic() > deadline:
                raise HarnessError(f"daemon pid {self.daemon_pid} still alive {timeout:.0f} s after SIGKILL")
            time.sleep(0.01)
        self.daemon_pid = None

    def lazy_unmount(self) -> None:
        if mounted_at(self.mnt):
            subprocess.run(["fusermount3", "-u", "-z", str(self.mnt)], capture_output=True, timeout=60)
        if mounted_at(self.mnt):
            raise HarnessError(f"{self.mnt} still mounted after fusermount3 -u -z")

    def daemon_log_problems(self) -> list[str]:
        """Warnings and errors the daemon logged since this mount (it logs none in a sound run)."""
        try:
            with open(self.store / "cowfs.log", "rb") as f:
                f.seek(self.log_pos)
                text = f.read().decode(errors="replace")
        except OSError:
            return []
        bad = [line for line in text.splitlines()
               if re.match(r"\S+ \S+ \d+ (WARNING|ERROR|CRITICAL) ", line) or line.startswith("Traceback")]
        more = [f"daemon log: ... {len(bad) - 10} more"] if len(bad) > 10 else []
        return [f"daemon log: {line}" for line in bad[:10]] + more

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
            self.daemon_pid = int(text) if text.isdigit() and self.ours(int(text)) else None
        if self.daemon_alive() and mounted_at(self.mnt):
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

    # -- the run phase of a cycle: writer, snapshots, in-mount gc, kill -------------------

    def spawn_writer(self, cycle: int) -> Writer:
        return Writer(self, cycle, self.rng.randrange(1 << 31))

    def pick_target(self, rng: random.Random) -> Target:
        _, kind, event, max_nth, max_delay = rng.choices(TARGETS, [t[0] for t in TARGETS])[0]
        nth = rng.randint(1, max_nth) if max_nth else 0
        delay = rng.uniform(0.05, self.args.max_run) if kind == "time" else rng.uniform(0, max_delay)
        return Target(kind, event, nth, delay)

    def fire(self, cyc: Cycle, reason: str) -> None:
        """kill -9 the daemon (once per cycle) and note what was going on."""
        with cyc.lock:
            if cyc.fired.is_set():
                return
            cyc.t_kill = time.monotonic()
            cyc.reason = reason
            cyc.writer_at_kill = cyc.writer.last_record()
            cyc.snap_at_kill = cyc.snap
            cyc.gc_at_kill = next((q for q in cyc.gc_requests if q.t_done is None and q.error is None), None)
            if cyc.gc_at_kill is not None:
                cyc.gc_at_kill.killed_in = cyc.gc_at_kill.phase()
            if not self.daemon_alive():
                cyc.errors.append(f"the daemon (pid {self.daemon_pid}) was already dead when the kill fired ({reason})")
            elif (idle := cyc.t_kill - max(cyc.writer.last_receipt(), cyc.t_go)) > STALL:
                cyc.errors.append(f"the writer made no progress in the {idle:.1f}s before the kill ({reason}): "
                                  f"hung in a request to the daemon?")
            cyc.fired.set()
            self.kill_daemon()

    def fire_later(self, cyc: Cycle, reason: str) -> None:
        t = threading.Timer(cyc.target.delay, self.fire, (cyc, f"{reason}+{cyc.target.delay * 1e3:.1f}ms"))
        t.daemon = True
        t.start()

    def snapshotter(self, cyc: Cycle, rng: random.Random) -> None:
        k = 0
        while not cyc.stop.wait(rng.uniform(0.15, 0.9)):
            if cyc.fired.is_set():
                return
            name = f"c{cyc.index:03d}-{k}"
            k += 1
            self.uncertain[name] = "mkdir"
            cyc.snap = f"mkdir {name}"
            if cyc.target.kind == "snapshot" and k == cyc.target.nth:
                self.fire_later(cyc, f"snapshot#{k}")
            window = cyc.snap_windows[name] = [time.monotonic(), math.inf]
            try:
                os.mkdir(self.mnt / ".snapshots" / name)
                window[1] = time.monotonic()
                cyc.snap = f"reading {name}"
                files = walk_tree(self.mnt / ".snapshots" / name)
            except OSError as e:
                if not cyc.fired.is_set():
                    cyc.errors.append(f"snapshot {name}: {e!r} while the daemon was alive")
                return
            snap = Snapshot(name, cyc.index)
            snap.files = files
            self.snapshots[name] = snap
            del self.uncertain[name]
            while len(self.snapshots) > self.args.max_snapshots:
                old = next(iter(self.snapshots))
                self.uncertain[old] = "rmdir"
                cyc.snap = f"rmdir {old}"
                try:
                    os.rmdir(self.mnt / ".snapshots" / old)
                except OSError as e:
                    if not cyc.fired.is_set():
                        cyc.errors.append(f"rmdir snapshot {old}: {e!r} while the daemon was alive")
                    return
                del self.snapshots[old]
                del self.uncertain[old]
            cyc.snap = "idle"

    def gc_requester(self, cyc: Cycle, rng: random.Random) -> None:
        """gc and prune requests to the daemon while the writer runs, as `cowfs gc MNT` and
        `cowfs prune MNT --keep-name GLOB --keep-history 0` send them (straight to the daemon's
        socket: never a fallback that would open the store in this process)."""
        from cowfs.control import DaemonTarget

        n = 0
        while not cyc.stop.wait(rng.uniform(0.05, 0.4 * self.args.max_run) if n == 0 else rng.uniform(0.2, 0.8)):
            if cyc.fired.is_set():
                return
            n += 1
            req = GcRequest(n, "prune" if rng.random() < 0.6 else "gc", time.monotonic())
            cyc.gc_requests.append(req)
            if cyc.target.kind == "gc" and n == cyc.target.nth:
                self.fire_later(cyc, f"gc#{n} {req.op}")

            def progress(done: int, total: int, req: GcRequest = req) -> None:
                if req.progress is None and cyc.target.kind == "gc-punch" and req.n == cyc.target.nth:
                    self.fire_later(cyc, f"gc#{req.n} {req.op} punching")
                req.progress = (done, total)

            try:
                conn = DaemonTarget(self.store)
                try:
                    args = {"keep_name": [SNAP_GLOB]} if req.op == "prune" else {}
                    result = conn.call(req.op, progress=progress, **args)
                finally:
                    conn.close()
            except Exception as e:  # noqa: BLE001 - expected only once the daemon is killed
                req.error = repr(e)
                if not cyc.fired.is_set():
                    cyc.errors.append(f"in-mount {req.op}: {e!r} while the daemon was alive")
                return
            req.t_done = time.monotonic()
            req.result = result
            if req.op == "prune" and (gone := [s["name"] for s in result["snapshots"] if not s["keep"]]):
                cyc.errors.append(f"in-mount prune removed snapshots {gone}: they all match {SNAP_GLOB!r}")

    def run_phase(self, cyc: Cycle, rng: random.Random, mount_gc: bool) -> None:
        w, target = cyc.writer, cyc.target
        if target.kind == "event":
            seen = [0]

            def on_record(r: dict) -> None:
                if r["ev"] == target.event:
                    seen[0] += 1
                    if seen[0] == target.nth:
                        if target.delay:
                            time.sleep(target.delay)
                        self.fire(cyc, f"{target.event}#{target.nth}+{target.delay * 1e3:.1f}ms")
            with w.lock:
                w.listeners.append(on_record)

        threads = [threading.Thread(target=self.snapshotter, args=(cyc, random.Random(rng.randrange(1 << 31))),
                                    name="snapshots", daemon=True)]
        if mount_gc:
            threads.append(threading.Thread(target=self.gc_requester, args=(cyc, random.Random(rng.randrange(1 << 31))),
                                            name="gc", daemon=True))
        w.go(self.next_step)
        cyc.t_go = time.monotonic()
        for t in threads:
            t.start()
        deadline = cyc.t_go + (target.delay if target.kind == "time" else self.args.max_run + 3)
        while not cyc.fired.wait(0.01):
            if w.proc.poll() is not None:
                cyc.early_exit = w.proc.returncode
                self.fire(cyc, "writer exited")
            elif cyc.errors:
                self.fire(cyc, "error")
            elif time.monotonic() >= deadline:
                self.fire(cyc, f"time {target.delay:.2f}s" if target.kind == "time" else f"time (no {target.describe()})")
        # the daemon is killed (in fire): kill the writer, wait for our threads, lazy unmount
        w.kill()
        cyc.stop.set()
        for t in threads:
            t.join(30)
            if t.is_alive():
                raise HarnessError(f"the {t.name} thread is stuck after the daemon was killed")
        self.wait_daemon_gone()
        self.lazy_unmount()

    # -- one cycle ---------------------------------------------------------------------

    def run_cycle(self, cycle: int) -> tuple[bool, str, list[str]]:
        t0 = time.monotonic()
        cseed = self.rng.randrange(1 << 31)
        rng = random.Random(cseed)
        w = self.next_writer or self.spawn_writer(cycle)
        self.writer = w
        # the next cycle's writer starts now: torch's import and its warm-up overlap this cycle
        self.next_writer = self.spawn_writer(cycle + 1) if cycle + 1 < self.args.cycles else None
        if not w.ready.wait(120):
            raise HarnessError(f"writer not ready after 120 s: {w.stderr_tail()}")
        cyc = Cycle(cycle, cseed, w, self.pick_target(rng))
        mount_gc = cyc.target.kind.startswith("gc") or rng.random() < self.args.mount_gc_prob
        self.run_phase(cyc, rng, mount_gc)
        self.writer = None
        problems = list(cyc.errors) + self.daemon_log_problems()
        if cyc.early_exit is not None:
            problems.append(f"the writer exited ({cyc.early_exit}) before the kill:\n{w.stderr_tail()}")

        # the writer's durable log: the model, and what each snapshot of this cycle may hold
        cyc.records = w.file_records()
        windows = {name: (t1, min(t2, cyc.t_kill)) for name, (t1, t2) in cyc.snap_windows.items()}
        cyc.snap_states = self.model.replay(cyc.records, windows)
        cyc.renames = list(self.model.renames)
        closed: dict[str, list[str]] = {}
        for r in cyc.records:
            if r["ev"] == "closed":
                closed.setdefault(r["path"], []).append(r["sha"])
            if "step" in r:
                self.next_step = max(self.next_step, r["step"] + 1)
        steps = len({r["step"] for r in cyc.records if "step" in r})
        n_closed = sum(len(v) for v in closed.values())
        self.count_kill(cyc, mount_gc, n_closed)

        notes, found, dumped, verified = self.offline(cyc, closed, rng, problems)
        self.mount()
        vbytes, nfiles, nsnaps = self.check(cyc, problems)
        excused = self.judge_history(cyc, found, problems)
        self.load_dumped(dumped, problems)
        verified += vbytes
        self.totals["bytes"] += verified
        self.totals["files"] += nfiles
        self.totals["snapshots"] += nsnaps

        ok = not problems
        wr = cyc.writer_at_kill
        where = writer_phase(wr)
        if where != "starting":
            where += " " + str((wr or {}).get("path") or (wr or {}).get("src") or "")
        q = cyc.killed_in_gc()
        if q is not None:
            where += f", {q.op} {q.killed_in}"
        gc_notes = ", ".join(f"{q.note()}" for q in cyc.gc_requests)
        line = (f"cycle {cycle + 1:>3}/{self.args.cycles} seed {cseed}: kill {cyc.t_kill - cyc.t_go:.2f}s in [{cyc.reason}] "
                f"writer {where}, snapshots {cyc.snap_at_kill} | {steps} steps, {n_closed} closes"
                + (f" | mount gc: {gc_notes or 'none sent'}" + (f", {excused} closed versions expired" if excused else "")
                   if mount_gc else "")
                + f" | {', '.join(notes)} | {nfiles} files + {nsnaps} snapshots, {human_bytes(verified)} verified | "
                f"{'recovered' if ok else 'FAILED'} ({time.monotonic() - t0:.1f}s)")
        return ok, line, problems

    def count_kill(self, cyc: Cycle, mount_gc: bool, n_closed: int) -> None:
        T = self.totals
        T["closed"] += n_closed
        T["kills"] += 1
        phase = writer_phase(cyc.writer_at_kill)
        T["writer_at_kill"][phase] = T["writer_at_kill"].get(phase, 0) + 1
        if cyc.snap_at_kill.startswith("mkdir"):
            T["in_snapshot_mkdir"] += 1
        q = cyc.killed_in_gc()
        if q is not None:
            T["in_gc"][q.killed_in] = T["in_gc"].get(q.killed_in, 0) + 1
        T["mount_gc_cycles"] += mount_gc
        for q in cyc.gc_requests:
            T["mount_gc"][q.op] += 1
            if q.result is not None:
                T["mount_gc_answered"] += 1
                T["mount_gc_freed"] += q.freed()
                T["mount_gc_rows"] += q.result.get("history_rows_dropped", 0)

    # -- unmounted: fsck, history, expiry, gc ------------------------------------------------

    def offline(self, cyc: Cycle, closed: dict[str, list[str]], rng: random.Random,
                problems: list[str]) -> tuple[list[str], dict[str, list[str]], dict[str, tuple[str, Path]], int]:
        notes = []
        t = time.monotonic()
        r = self.cowfs("fsck", str(self.store))
        notes.append(f"fsck {'clean' if r.returncode == 0 else 'FAILED'} {time.monotonic() - t:.1f}s")
        if r.returncode != 0:
            out = (r.stdout.strip() + "\n" + r.stderr.strip()).strip().splitlines()
            problems.append(f"cowfs fsck exited {r.returncode}:\n" + "\n".join(out[:15])
                            + (f"\n... {len(out) - 15} more lines" if len(out) > 15 else ""))

        # closed versions no later check loads (not live, not in a snapshot of this cycle): load them from history
        later = {next(iter(states)) for states in self.model.allowed.values() if len(states) == 1}
        later |= {st for s in self.snapshots.values() if not s.validated for st, _ in (s.files or {}).values()}
        dump_dir = self.logs / f"loads-{cyc.index:03d}"
        dumped: dict[str, tuple[str, Path]] = {}  # sha -> (path it was closed at, file with its bytes)
        for path, shas in closed.items():
            for sha in shas:
                if sha not in self.loaded and sha not in later and sha != EMPTY:
                    dumped[sha] = (path, dump_dir / sha)
        if dumped:
            dump_dir.mkdir(exist_ok=True)
        # contents first written and closed once in this cycle: their versions must be born in close order
        once = Counter((r["path"], r["sha"]) for r in cyc.records if r["ev"] == "closed")
        order = {p: [x for x in shas if once[p, x] == 1 and self.model.first_t[x] > cyc.t_go]
                 for p, shas in closed.items()}
        spec = {"store": str(self.store), "expire": rng.random() < 0.75, "closed": closed, "order": order,
                "ever": {p: sorted(x for x in self.model.ever.get(p, ()) if x not in (None, DIR)) for p in closed},
                "dump": {sha: str(f) for sha, (_, f) in dumped.items()}}
        spec_path = self.logs / f"inspect-{cyc.index:03d}.json"
        spec_path.write_text(json.dumps(spec))
        r = subprocess.run([sys.executable, os.path.abspath(__file__), "_inspect", str(spec_path)],
                           capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
        found: dict[str, list[str]] = {}
        verified = 0
        if r.returncode != 0:
            problems.append(f"history check failed ({r.returncode}): {r.stderr.strip()[-2000:]}")
            found = {p: list(v) for p, v in closed.items()}  # reported already: judge nothing twice
        else:
            res = json.loads(r.stdout)
            problems.extend(res["problems"])
            found = res["found"]
            verified += res["bytes"]
            self.totals["history_versions"] += res["versions"]
            self.totals["expired"] += res["expired"] or 0

        if rng.random() < self.args.gc_prob:
            r = self.cowfs("gc", str(self.store), "--json")
            if r.returncode != 0:
                problems.append(f"cowfs gc exited {r.returncode}: {r.stderr.strip()}")
            else:
                freed = json.loads(r.stdout)["bytes_freed"]
                self.totals["gc_runs"] += 1
                self.totals["gc_freed"] += freed
                notes.append(f"gc {human_bytes(freed)} freed")
        return notes, found, dumped, verified

    # -- checks after remount ------------------------------------------------------------

    def load(self, name: str, path: Path, digest: str) -> None:
        """The file must load with the library that wrote it (`name`: the path it was written
        at); once per distinct content."""
        if digest in self.loaded:
            return
        if name.endswith(".pt"):
            import torch
            torch.load(path, map_location="cpu", weights_only=True)
        elif ".safetensors" in name:
            from safetensors.torch import load_file
            load_file(str(path))
        elif name.endswith(".json"):
            json.loads(path.read_text())
        else:
            raise HarnessError(f"no loader for {name}")
        self.loaded.add(digest)

    def check(self, cyc: Cycle, problems: list[str]) -> tuple[int, int, int]:
        model = self.model
        verified = nfiles = 0
        try:
            tree = walk_tree(self.mnt)
        except OSError as e:
            problems.append(f"walking the live tree: {e!r}")
            vbytes, nsnaps = self.check_snapshots(cyc, problems)
            return vbytes, 0, nsnaps  # no settle: the model keeps what the live tree should be
        live = {p: st for p, (st, _) in tree.items()}
        for p in sorted(set(live) | {p for p, a in model.allowed.items() if a != {None}}):
            got, allowed = live.get(p), model.get(p)
            if got not in allowed and not (allowed == {None} and model.may_be_save_file_tmp(p, got)):
                problems.append(f"{p}: live state {model.describe(got)}; allowed: {model.describe_all(allowed)}")
            elif got not in (None, DIR):
                nfiles += 1
                verified += tree[p][1]
        for rn in model.renames:
            if rn.t_done == math.inf and (bad := model.rename_violation(rn, live.get(rn.src), live.get(rn.dst))):
                problems.append(bad)
        for p, st in sorted(live.items()):
            if st not in (None, DIR, EMPTY):
                try:
                    self.load(p, self.mnt / p, st)
                except Exception as e:  # noqa: BLE001 - reported
                    problems.append(f"{p}: does not load: {e!r}")
        vbytes, nsnaps = self.check_snapshots(cyc, problems)
        model.settle(live)
        return verified + vbytes, nfiles, nsnaps

    def check_snapshots(self, cyc: Cycle, problems: list[str]) -> tuple[int, int]:
        verified = nsnaps = 0
        snapdir = self.mnt / ".snapshots"
        try:
            present = set(os.listdir(snapdir))
        except OSError as e:
            problems.append(f"listing .snapshots: {e!r}")
            present = set()
        for name in list(self.snapshots):
            if name not in present:
                if self.uncertain.get(name) != "rmdir":
                    problems.append(f"snapshot {name} (taken in cycle {self.snapshots[name].cycle + 1}) is gone")
                self.uncertain.pop(name, None)
                del self.snapshots[name]
        for name in sorted(present):
            snap = self.snapshots.get(name)
            if snap is None:
                if self.uncertain.get(name) != "mkdir":
                    problems.append(f"unknown snapshot {name} in .snapshots")
                    continue
                snap = Snapshot(name, cyc.index)  # its mkdir was interrupted by the kill but it exists
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
            for p in sorted(set(files) | set(snap.files)):  # byte-exact, every time
                want, got = snap.files.get(p), files.get(p)
                if want != got:
                    problems.append(f"snapshot {name}: {p} is {self.model.describe(got and got[0])}, "
                                    f"recorded {self.model.describe(want and want[0])} when the snapshot was taken")
                elif got[0] != DIR:
                    verified += got[1]
            if not snap.validated:  # once: against the writer's log while its mkdir ran
                problems.extend(self.snapshot_vs_log(cyc, name, snap.files))
                snap.validated = True
        for name in [n for n in self.uncertain if n not in present]:
            del self.uncertain[name]  # an interrupted mkdir that never happened, or an rmdir that did
        return verified, nsnaps

    def snapshot_vs_log(self, cyc: Cycle, name: str, files: dict[str, tuple[str, int]]) -> list[str]:
        """A snapshot is the tree at one moment while its mkdir ran: every path as the writer's log
        allows then (present or absent, a complete version), renames all or nothing; files load."""
        model = self.model
        if name not in cyc.snap_states:
            return [f"snapshot {name}: taken in cycle {cyc.index + 1} but no mkdir of it was seen"]
        states = cyc.snap_states[name]
        t1, t2 = cyc.snap_windows[name][0], min(cyc.snap_windows[name][1], cyc.t_kill)
        out = []
        for p in sorted(set(files) | {p for p, s in states.items() if None not in s}):
            got = files[p][0] if p in files else None
            allowed = states.get(p, {None})
            if got not in allowed and not (allowed == {None} and model.may_be_save_file_tmp(p, got, ever=True)):
                out.append(f"snapshot {name}: {p} is {model.describe(got)}; while its mkdir ran "
                           f"({t2 - t1:.3f}s) the writer's log allows: {model.describe_all(allowed)}")
            elif got not in (None, DIR, EMPTY):
                try:
                    self.load(p, self.mnt / ".snapshots" / name / p, got)
                except Exception as e:  # noqa: BLE001 - reported
                    out.append(f"snapshot {name}: {p} does not load: {e!r}")
        for rn in cyc.renames:  # the rename, if the snapshot's moment may fall in it
            if rn.t_src_closed < t1 and t2 < rn.t_next and t1 <= rn.t_done and rn.t_begin <= t2:
                state = lambda p: files[p][0] if p in files else None  # noqa: E731
                if bad := model.rename_violation(rn, state(rn.src), state(rn.dst)):
                    out.append(f"snapshot {name}: {bad}")
        return out

    def judge_history(self, cyc: Cycle, found: dict[str, list[str]], problems: list[str]) -> int:
        """Every version closed this cycle must be in its path's history, unless an in-mount prune
        may have expired it: it was replaced (or its name removed) before that prune ended, and no
        snapshot that exists now holds it. Returns how many were excused so."""
        held: dict[tuple[str, str], str] = {}
        for s in self.snapshots.values():
            for p, (st, _) in (s.files or {}).items():
                held.setdefault((p, st), s.name)
        prunes = [q for q in cyc.gc_requests if q.op == "prune"]  # one that failed otherwise is reported already
        excused = 0
        for i, r in enumerate(cyc.records):
            if r["ev"] != "closed" or r["sha"] in found.get(r["path"], ()):
                continue
            path, sha = r["path"], r["sha"]
            lost = (f"history of {path}: closed version {self.model.describe(sha)} is not readable from it "
                    f"(close() had returned")
            if (path, sha) in held:
                problems.append(f"{lost}; snapshot {held[(path, sha)]} holds it)")
                continue
            t_end = next((x["t"] for x in cyc.records[i + 1:] if ends_at(x, path)), None)
            if t_end is not None and any(t_end < (q.t_done if q.t_done is not None else cyc.t_kill) for q in prunes):
                excused += 1
            else:
                problems.append(f"{lost}; " + ("it was never replaced" if t_end is None else
                                               "no in-mount prune ran after it was replaced") + ")")
        self.totals["expired_by_prune"] += excused
        return excused

    def load_dumped(self, dumped: dict[str, tuple[str, Path]], problems: list[str]) -> None:
        """Load the closed versions no other check loaded, from the bytes the history check wrote."""
        for sha, (path, f) in dumped.items():
            if sha in self.loaded or not f.exists():  # loaded meanwhile, or missing (judged above)
                continue
            try:
                self.load(path, f, sha)
                self.totals["loaded_from_history"] += 1
            except Exception as e:  # noqa: BLE001 - reported
                problems.append(f"history of {path}: closed version {sha[:12]} does not load: {e!r}")
        if dumped:
            shutil.rmtree(next(iter(dumped.values()))[1].parent, ignore_errors=True)


    # -- the run -----------------------------------------------------------------------

    def run(self) -> int:
        a = self.args
        print(f"crashtest: {a.cycles} cycles, seed {self.seed}, store {self.store}, work dir {self.work}", flush=True)
        if (self.store / "cowfs-store.json").exists():
            raise HarnessError(f"{self.store} is already a store: the harness needs a fresh one (it expires history)")
        if self.store.exists() and any(self.store.iterdir()):
            raise HarnessError(f"{self.store} exists and is not empty (give a new or empty directory)")
        r = self.cowfs("init", str(self.store), "--segment-size", a.segment_size, "--device", a.device)
        if r.returncode != 0:
            raise HarnessError(f"cowfs init failed: {r.stderr.strip()}")
        t_start = time.monotonic()
        recovered = 0
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
        final = []
        r = self.cowfs("umount", str(self.mnt), timeout=120)
        if r.returncode != 0:
            final.append(f"final cowfs umount failed: {r.stderr.strip()}")
        else:
            self.daemon_pid = None
        final += self.daemon_log_problems()
        r = self.cowfs("fsck", str(self.store))
        if r.returncode != 0:
            final.append(f"final fsck failed:\n{r.stdout}{r.stderr}")
        for line in final:
            print(line, flush=True)
        r = self.cowfs("stats", str(self.store), "--json")
        stats = json.loads(r.stdout) if r.returncode == 0 else {}
        self.print_totals(stats)
        print(f"{recovered}/{a.cycles} recovered ({self.totals['kills']} kills, {human_bytes(self.totals['bytes'])} verified) "
              f"in {time.monotonic() - t_start:.1f}s (seed {self.seed})"
              + ("; final unmount/fsck FAILED" if final else ""), flush=True)
        return 0 if recovered == a.cycles and not final else 1

    def print_totals(self, stats: dict) -> None:
        T = self.totals
        by = lambda d: ", ".join(f"{k} {v}" for k, v in sorted(d.items(), key=lambda kv: -kv[1])) or "none"  # noqa: E731
        print(f"kills: {T['kills']} (writer: {by(T['writer_at_kill'])}; {T['in_snapshot_mkdir']} during a snapshot "
              f"mkdir; {sum(T['in_gc'].values())} during an in-mount gc/prune: {by(T['in_gc'])})", flush=True)
        print(f"verified: {human_bytes(T['bytes'])} ({T['bytes']} bytes): {T['files']} live files, {T['snapshots']} snapshot "
              f"checks, {T['history_versions']} versions from history ({T['loaded_from_history']} loaded from there), "
              f"{T['closed']} closes reported by the writer", flush=True)
        print(f"in-mount gc: {T['mount_gc_cycles']} cycles, {T['mount_gc']['prune']} prune + {T['mount_gc']['gc']} gc "
              f"requests, {T['mount_gc_answered']} answered: {human_bytes(T['mount_gc_freed'])} freed, {T['mount_gc_rows']} "
              f"history rows dropped; {T['expired_by_prune']} closed versions expired by them", flush=True)
        print(f"unmounted: gc {T['gc_runs']} runs, {human_bytes(T['gc_freed'])} freed; {T['expired']} history rows expired; store "
              + (f"{human_bytes(stats.get('physical_bytes', 0))} physical, dedup {stats.get('dedup_ratio', 0):.2f}" if stats else "?"),
              flush=True)


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
    ap.add_argument("--device", default=DEFAULT_DEVICE, choices=DEVICES)
    ap.add_argument("--segment-size", default="4M", help="small segments: rotations happen during the run")
    ap.add_argument("--max-snapshots", type=int, default=6, help="older snapshots are deleted (rmdir) beyond this")
    ap.add_argument("--max-run", type=float, default=3.0, help="longest writer run before the kill, seconds")
    ap.add_argument("--gc-prob", type=float, default=0.3, help="chance of a `cowfs gc` between cycles (unmounted)")
    ap.add_argument("--mount-gc-prob", type=float, default=0.5,
                    help="chance of in-mount gc/prune requests while the writer runs (always when the kill targets gc)")
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
