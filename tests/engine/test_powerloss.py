"""Power loss at random points: only what was made durable survives, and recovery must cope.

The segment files go through the simulated disk of `tests/support/powerloss_device.py`: it
knows, for every segment, the bytes as of the last fdatasync/persist and whether
its directory entry was fsynced. A random crash point (any segment write,
persist, punch, truncate, create, directory fsync, or any catalog transaction,
before it runs or right after it committed) raises `PowerLoss` and freezes the
disk; the store object is dropped without closing it, and the segments
directory is rewritten to what survives a power cut, either with everything not
durable thrown away ("drop") or with an arbitrary subset of it reaching the disk
("torn": each dirty 4 KiB page, pending size change, create and unlink decided
independently). The catalog is SQLite with synchronous=FULL, so it holds exactly
the transactions that committed. Then the store is reopened (recovery runs, and
sometimes loses power again itself) and must satisfy:

  * fsck is clean;
  * the live tree holds exactly the files of the reference model, byte-exact: a
    version whose commit() returned is there; an operation cut short shows the
    state after exactly the catalog transactions it committed (a file whose
    commit transaction did not commit reads as its previous version);
  * every snapshot shows exactly the tree it was taken of.

(Between crashes, every file an operation changed is also read back at once.)
At the end of each run, gc must leave no unreferenced record, and a clean
close and open must keep everything.

Between crashes the operations are random: write_file, create_filled (a file made by its
first version, as a copy-up makes one), write sessions with
random writes/truncates (one or two commits, or an abort), sequential streaming
rewrites in several batches (the session BATCH is lowered per run so the
chunking workers and rotation inside them are exercised), two interleaved
sessions (often writing the same bytes, so one dedups against the other's
uncommitted records), expire_history + gc while a session has uncommitted
records in the log, rename, unlink, snapshot create/delete, expire_history + gc
(gc punches dead space without fsync), gc, compaction (files are sometimes safetensors
checkpoints of a drifting model, so it re-cuts them and makes deltas), and clean close +
reopen. Segments
are 4 MiB and files up to 3 MiB, so segments rotate often. All three devices run:
`file` (fdatasync), `direct` (O_DIRECT blocks, the last partial block of a write
held in memory until persist) and `pmem` (only ranges both written back by
`_native.persist` and msync'ed count as durable).

Every run is seeded. `COWFS_POWERLOSS_SEED=<seed>` (with the device given by the
test id) replays one run; `COWFS_POWERLOSS_CRASHES=<n>` sets crash points per run.
"""
from __future__ import annotations

import contextlib
import os
import random
import shutil
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
from safetensors.numpy import save as save_safetensors

import cowfs.store.data.session as session_mod
from cowfs.store import ROOT_INO, Store
from tests.support.powerloss_device import Disk, PowerLoss, install

KiB, MiB = 1 << 10, 1 << 20
SEGMENT_SIZE = 4 * MiB
MAX_FILE = 3 * MiB
DIRS = ["/d0", "/d1"]
FILES = ["/f0", "/f1", "/d0/f0", "/d0/f1", "/d0/f2", "/d1/f0", "/d1/f1", "/d1/f2"]
SNAPS = ["s0", "s1", "s2"]
# the next crash comes 1..40 crash points later, or now and then after a long stretch
# (many operations, so head segments fill up and commits span a rotation)
SHORT_SPAN, LONG_SPAN, LONG_CHANCE = 40, 400, 0.3

CI_CRASHES_PER_DEVICE = 70  # 210 in all (the suite must stay under 20 minutes on 2 busy cores)
SLOW_CRASHES_PER_DEVICE = 1500
CRASHES_PER_RUN = 10


# -- the reference model ----------------------------------------------------------------------


@dataclass
class Model:
    files: dict[str, bytes] = field(default_factory=dict)
    snaps: dict[str, dict[str, bytes]] = field(default_factory=dict)

    def copy(self) -> "Model":
        return Model(dict(self.files), dict(self.snaps))  # snapshot dicts are never changed in place


@dataclass
class Op:
    """One operation: the model after 0, 1, 2... of its state-changing transactions committed."""

    desc: str
    txns: set[str]  # catalog ops (Catalog.write op names) that move the model to the next state
    states: list[Model]
    run: Callable[["Run"], None]


def pick_size(rng: random.Random) -> int:
    r = rng.random()
    if r < 0.35:
        return rng.randint(0, 64 * KiB)
    if r < 0.65:
        return rng.randint(64 * KiB, 1 * MiB)
    return rng.randint(1 * MiB, MAX_FILE)


_WEIGHTS: dict[str, np.ndarray] = {}


def checkpoint_data(rng: random.Random) -> bytes:
    """A safetensors checkpoint of a model that drifts a little from save to save: the
    compactor re-cuts it into tensor pieces and turns older pieces into deltas."""
    if not _WEIGHTS:
        g = np.random.default_rng(11)
        _WEIGHTS.update(a=g.standard_normal((256, 1024), np.float32), b=g.standard_normal((96, 1024), np.float32),
                        c=g.standard_normal((64,), np.float32))
    noise = np.random.default_rng(rng.randint(0, 7))
    return save_safetensors({k: v + noise.standard_normal(v.shape, np.float32) * np.float32(1e-3)
                             for k, v in _WEIGHTS.items()})


def gen_data(rng: random.Random, model: Model) -> bytes:
    """Fresh bytes, an exact copy of a file (full dedup), a patched copy (partial dedup), zero
    runs, or a checkpoint file the compactor recognises."""
    if rng.random() < 0.15:
        return checkpoint_data(rng)
    r = rng.random()
    if model.files and r < 0.2:
        return model.files[rng.choice(sorted(model.files))]
    if model.files and r < 0.5:
        out = bytearray(model.files[rng.choice(sorted(model.files))])
        for _ in range(rng.randint(1, 3)):
            off = rng.randint(0, len(out))
            patch = rng.randbytes(rng.randint(1, 128 * KiB))
            out[off:off + len(patch)] = patch
        if rng.random() < 0.3:
            out += rng.randbytes(rng.randint(1, 512 * KiB))
        return bytes(out[:MAX_FILE])
    n = pick_size(rng)
    if r < 0.6:
        a = rng.randint(0, n)
        z = rng.randint(0, n - a)
        return rng.randbytes(a) + bytes(z) + rng.randbytes(n - a - z)
    return rng.randbytes(n)


def split(path: str) -> tuple[str, bytes]:
    head, _, name = path.rpartition("/")
    return head or "/", name.encode()


# -- operations -----------------------------------------------------------------------------------


def op_write_file(rng: random.Random, m: Model) -> Op:
    path = rng.choice(FILES)
    data = gen_data(rng, m)
    states = [m.copy()]
    if path not in m.files:
        s = m.copy()
        s.files[path] = b""
        states.append(s)
    s = m.copy()
    s.files[path] = data
    states.append(s)
    return Op(f"write_file {path} ({len(data)} B)", {"create", "commit"}, states, lambda r: r.store.write_file(path, data))


def op_create_filled(rng: random.Random, m: Model) -> Op:
    """A file made by its first version (a copy-up's create): no state in which it is empty."""
    path = rng.choice([p for p in FILES if p not in m.files])
    data = gen_data(rng, m)
    after = m.copy()
    after.files[path] = data
    head, name = split(path)

    def fill(session) -> None:  # type: ignore[no-untyped-def]
        for off in range(0, len(data), 700 * KiB):
            session.write(off, data[off:off + 700 * KiB])

    return Op(f"create_filled {path} ({len(data)} B)", {"create"}, [m.copy(), after],
              lambda r: r.store.create_filled(r.store.resolve(head).ino, name, fill))


def _edits(rng: random.Random, cur: bytearray, donor: bytes) -> list[tuple]:
    out: list[tuple] = []
    for _ in range(rng.randint(1, 6)):
        if rng.random() < 0.2:
            size = rng.choice([0, rng.randint(0, len(cur) + 1), min(MAX_FILE, len(cur) + rng.randint(1, 300 * KiB))])
            out.append(("truncate", size))
            del cur[size:]
            cur.extend(bytes(size - len(cur)))
            continue
        off = rng.randint(0, min(len(cur) + 64 * KiB, MAX_FILE - 1))
        n = rng.randint(1, min(256 * KiB, MAX_FILE - off))
        if donor and rng.random() < 0.3:  # bytes another file has: dedup inside a session
            a = rng.randint(0, max(len(donor) - 1, 0))
            data = donor[a:a + n]
        else:
            data = rng.randbytes(n)
        if not data:
            data = b"x"
        out.append(("write", off, data))
        if off > len(cur):
            cur.extend(bytes(off - len(cur)))
        cur[off:off + len(data)] = data
    return out


def _apply(session, edits: list[tuple]) -> None:  # type: ignore[no-untyped-def]
    for e in edits:
        if e[0] == "truncate":
            session.truncate(e[1])
        else:
            session.write(e[1], e[2])


def op_edit(rng: random.Random, m: Model) -> Op:
    """A session with random writes and truncates: commit, then maybe more edits and commit or abort."""
    path = rng.choice(sorted(m.files))
    donor = m.files[rng.choice(sorted(m.files))]
    cur = bytearray(m.files[path])
    round1 = _edits(rng, cur, donor)
    s1 = m.copy()
    s1.files[path] = bytes(cur)
    states = [m.copy(), s1]
    round2: list[tuple] = []
    end2 = None
    if rng.random() < 0.5:
        round2 = _edits(rng, cur, donor)
        end2 = "commit" if rng.random() < 0.7 else "abort"
        if end2 == "commit":
            s2 = m.copy()
            s2.files[path] = bytes(cur)
            states.append(s2)

    def run(r: "Run") -> None:
        ino = r.store.resolve(path).ino
        with r.store.open_session(ino) as s:
            _apply(s, round1)
            assert s.commit() is not None
            if end2 is not None:
                _apply(s, round2)
                if end2 == "commit":
                    assert s.commit() is not None
                else:
                    s.abort()

    desc = f"edit {path}: {len(round1)} edits, commit" + (f"; {len(round2)} edits, {end2}" if end2 else "")
    return Op(desc, {"commit"}, states, run)


def op_stream(rng: random.Random, m: Model) -> Op:
    """Sequential writes from offset 0 in pieces (the streaming path, batch by batch)."""
    path = rng.choice(FILES)
    data = gen_data(rng, m)
    old = m.files.get(path)
    trunc = old is None or rng.random() < 0.6
    result = data if trunc or old is None else data + old[len(data):]
    pieces = []
    pos = 0
    while pos < len(data):
        n = rng.randint(1, 700 * KiB)
        pieces.append((pos, data[pos:pos + n]))
        pos += n
    states = [m.copy()]
    if old is None:
        s = m.copy()
        s.files[path] = b""
        states.append(s)
    s = m.copy()
    s.files[path] = result
    states.append(s)

    def run(r: "Run") -> None:
        parent, name = split(path)
        if old is None:
            ino = r.store.create(r.store.resolve(parent).ino, name).ino
        else:
            ino = r.store.resolve(path).ino
        with r.store.open_session(ino) as s:
            if trunc:
                s.truncate(0)
            for off, piece in pieces:
                s.write(off, piece)
            if not pieces and not trunc:
                s.truncate(s.size)  # nothing to write: still a new version
            assert s.commit() is not None

    return Op(f"stream {path} ({len(data)} B in {len(pieces)} writes, truncate={trunc})", {"create", "commit"}, states, run)


def op_session_gc(rng: random.Random, m: Model) -> Op:
    """gc (after expire_history) while a session has appended records that are not committed yet."""
    path = rng.choice(sorted(m.files))
    old = m.files[path]
    data = gen_data(rng, m)
    cut = rng.randint(0, len(data))
    cur = bytearray(data)
    edits = _edits(rng, cur, old) if rng.random() < 0.5 else []
    expire = rng.random() < 0.7
    s1 = m.copy()
    s1.files[path] = bytes(cur)

    def run(r: "Run") -> None:
        ino = r.store.resolve(path).ino
        batch = session_mod.BATCH
        session_mod.BATCH = min(batch, 256 * KiB)  # the first part reaches the log before gc runs
        try:
            with r.store.open_session(ino) as s:
                s.truncate(0)
                for pos in range(0, cut, 300 * KiB):
                    s.write(pos, data[pos:min(pos + 300 * KiB, cut)])
                s.read(0, 1)  # wait for the running batch: its records are in flight, not committed
                if expire:
                    r.store.expire_history(0)
                r.store.gc()
                if cut < len(data):
                    s.write(cut, data[cut:])
                _apply(s, edits)
                assert s.commit() is not None
        finally:
            session_mod.BATCH = batch

    desc = f"session_gc {path}: {cut} of {len(data)} B, {'expire + ' if expire else ''}gc, rest, {len(edits)} edits, commit"
    return Op(desc, {"commit"}, [m.copy(), s1], run)


def op_two_sessions(rng: random.Random, m: Model) -> Op:
    """Two files rewritten by interleaved sessions, often with the same bytes (dedup against
    the other session's appended but uncommitted records); each ends in commit or abort.
    Half the time the second session's writes run while the first head segment is taken (as
    an append running beside them would), so its records go to a second head segment."""
    pa, pb = rng.sample(sorted(m.files), 2)
    da = gen_data(rng, m)
    db = da if rng.random() < 0.5 else gen_data(rng, m)
    piece = rng.choice([64 * KiB, 300 * KiB, 1 * MiB])
    ends = {pa: rng.choice(["commit", "commit", "abort"]), pb: rng.choice(["commit", "commit", "abort"])}
    order = [pa, pb] if rng.random() < 0.5 else [pb, pa]
    second_head = rng.random() < 0.5
    states = [m.copy()]
    for p in order:
        if ends[p] == "commit":
            s = states[-1].copy()
            s.files[p] = da if p == pa else db
            states.append(s)

    def run(r: "Run") -> None:
        with r.store.open_session(r.store.resolve(pa).ino) as sa, r.store.open_session(r.store.resolve(pb).ino) as sb:
            sess = {pa: (sa, da), pb: (sb, db)}
            sa.truncate(0)
            sb.truncate(0)
            for pos in range(0, max(len(da), len(db)), piece):
                for p in (pa, pb):
                    s, d = sess[p]
                    if pos < len(d):
                        with _first_head_taken(r.store) if second_head and p == pb else contextlib.nullcontext():
                            s.write(pos, d[pos:pos + piece])
                            s.read(0, 1)  # wait for the session's batch: one append at a time keeps runs replayable
            for p in order:
                s, _ = sess[p]
                if ends[p] == "commit":
                    assert s.commit() is not None
                else:
                    s.abort()

    same = " (same bytes)" if da is db else ""
    heads = ", the second into a second head" if second_head else ""
    return Op(f"two_sessions {pa}:{ends[pa]} {pb}:{ends[pb]}{same}{heads}", {"commit"}, states, run)


def _first_head_taken(store: Store) -> contextlib.AbstractContextManager:
    """The log's first head held by this thread, so that the appends meanwhile go to another
    head segment (none where the log has one head only: the append would wait for this one)."""
    heads = store.log._heads
    return heads.take_first() if heads.most >= 2 else contextlib.nullcontext()


def op_rename(rng: random.Random, m: Model) -> Op:
    src = rng.choice(sorted(m.files))
    dst = rng.choice([p for p in FILES if p != src])
    s = m.copy()
    s.files[dst] = s.files.pop(src)

    def run(r: "Run") -> None:
        (sp, sn), (dp, dn) = split(src), split(dst)
        r.store.rename(r.store.resolve(sp).ino, sn, r.store.resolve(dp).ino, dn)

    return Op(f"rename {src} -> {dst}" + (" (replacing)" if dst in m.files else ""), {"rename"}, [m.copy(), s], run)


def op_unlink(rng: random.Random, m: Model) -> Op:
    path = rng.choice(sorted(m.files))
    s = m.copy()
    del s.files[path]

    def run(r: "Run") -> None:
        parent, name = split(path)
        r.store.unlink(r.store.resolve(parent).ino, name)

    return Op(f"unlink {path}", {"unlink"}, [m.copy(), s], run)


def op_snapshot_create(rng: random.Random, m: Model) -> Op:
    name = rng.choice([n for n in SNAPS if n not in m.snaps])
    s = m.copy()
    s.snaps[name] = dict(m.files)
    return Op(f"snapshot_create {name}", {"snapshot"}, [m.copy(), s], lambda r: r.store.snapshot_create(name))


def op_snapshot_delete(rng: random.Random, m: Model) -> Op:
    name = rng.choice(sorted(m.snaps))
    s = m.copy()
    del s.snaps[name]
    return Op(f"snapshot_delete {name}", {"snapshot-delete"}, [m.copy(), s], lambda r: r.store.snapshot_delete(name))


def op_expire_gc(rng: random.Random, m: Model) -> Op:
    def run(r: "Run") -> None:
        r.store.expire_history(0)
        r.store.gc()

    return Op("expire_history(0) + gc", set(), [m.copy()], run)


def op_gc(rng: random.Random, m: Model) -> Op:
    return Op("gc", set(), [m.copy()], lambda r: r.store.gc())


def op_compact(rng: random.Random, m: Model) -> Op:
    """Re-cut and re-encode committed files: reads must not change, whatever the crash point."""
    workers = rng.choice([1, 2])
    return Op(f"compact ({workers} workers)", set(), [m.copy()], lambda r: r.store.compact(workers=workers))


def op_reopen(rng: random.Random, m: Model) -> Op:
    def run(r: "Run") -> None:
        r.store.close()
        r.store = None
        r.store = Store.open(r.root)

    return Op("close + open", set(), [m.copy()], run)


OPS: list[tuple[int, Callable[[random.Random, Model], Op], Callable[[Model], bool]]] = [
    (24, op_write_file, lambda m: True),
    (6, op_create_filled, lambda m: any(p not in m.files for p in FILES)),
    (20, op_edit, lambda m: bool(m.files)),
    (12, op_stream, lambda m: True),
    (6, op_session_gc, lambda m: bool(m.files)),
    (6, op_two_sessions, lambda m: len(m.files) >= 2),
    (8, op_rename, lambda m: bool(m.files)),
    (6, op_unlink, lambda m: bool(m.files)),
    (6, op_snapshot_create, lambda m: len(m.snaps) < len(SNAPS)),
    (4, op_snapshot_delete, lambda m: bool(m.snaps)),
    (10, op_expire_gc, lambda m: True),
    (4, op_gc, lambda m: True),
    (6, op_compact, lambda m: bool(m.files)),
    (5, op_reopen, lambda m: True),
]


def choose_op(rng: random.Random, m: Model) -> Op:
    ok = [(w, f) for w, f, pre in OPS if pre(m)]
    _, make = rng.choices(ok, weights=[w for w, _ in ok])[0]
    return make(rng, m)


# -- one run: a store that loses power again and again -------------------------------------------


@dataclass
class Stats:
    crashes: int = 0
    in_recovery: int = 0
    recovered: int = 0
    bytes_verified: int = 0
    ops: int = 0
    interrupted: Counter = field(default_factory=Counter)  # op kind -> crashes inside it
    partial: int = 0  # crashes inside an op after some but not all of its transactions committed
    modes: Counter = field(default_factory=Counter)
    sites: Counter = field(default_factory=Counter)
    disk: Counter = field(default_factory=Counter)

    def add(self, other: "Stats") -> None:
        for k in ("crashes", "in_recovery", "recovered", "bytes_verified", "ops", "partial"):
            setattr(self, k, getattr(self, k) + getattr(other, k))
        for k in ("interrupted", "modes", "sites", "disk"):
            getattr(self, k).update(getattr(other, k))


class Run:
    def __init__(self, base: Path, device: str, seed: int, crashes: int) -> None:
        self.device = device
        self.seed = seed
        self.target = crashes
        self.rng = random.Random(seed)
        self.root = base / f"pl-{device}-{seed}"
        self.model = Model()
        self.store: Store | None = None
        self.disk: Disk | None = None
        self.stats = Stats()
        self.trace: deque[str] = deque(maxlen=25)
        self.disk_site: str | None = None  # where the power went out last

    def fail(self, msg: str) -> None:
        trace = "\n  ".join(self.trace)
        pytest.fail(
            f"power-loss run device={self.device} seed={self.seed} (replay: COWFS_POWERLOSS_SEED={self.seed}"
            f" pytest 'tests/engine/test_powerloss.py::test_power_loss[{self.device}]'), crash #{self.stats.crashes}:\n"
            f"{msg}\nlast steps:\n  {trace}",
            pytrace=False,
        )

    def drop(self) -> None:
        """The process dies with the power: nothing is closed properly, nothing more is written."""
        s, self.store = self.store, None
        if s is None:
            return
        s.executor.shutdown(wait=True)  # queued batches find the disk dead and fail
        for session in list(s._sessions.values()):
            session.overlay.close()  # the spill file is unlinked: it goes with the process
        for seg in list(s.log._open.values()):
            seg.close()
        s.log._open.clear()
        s.catalog.close()  # committed transactions are durable already (synchronous=FULL)
        if not s.closed:
            os.close(s._lock_fd)
            s.closed = True

    def power_loss(self) -> None:
        assert self.disk is not None
        mode = self.rng.choice(["drop", "torn"])
        self.stats.modes[mode] += 1
        effects = self.disk.power_loss(mode)
        self.stats.disk.update(effects)
        self.trace.append(f"   power loss ({mode}) at {self.disk_site}: {effects}")

    def reopen_after_crash(self) -> int:
        """Open (recovery runs); now and then the power fails again during recovery."""
        assert self.disk is not None
        again = 0
        while True:
            if self.rng.random() < 0.3:
                self.disk.arm(self.rng.randint(1, 6))
            try:
                self.store = Store.open(self.root)
                self.disk.disarm()
                return again
            except PowerLoss:
                again += 1
                self.disk_site = self.disk.crash_site
                self.stats.crashes += 1
                self.stats.in_recovery += 1
                self.trace.append(f"   crash during recovery at {self.disk_site}")
                self.power_loss()

    def verify(self, when: str) -> None:
        assert self.store is not None and self.disk is not None
        self.disk.disarm()
        s = self.store
        report = s.fsck()
        if not report.clean:
            self.fail(f"{when}: fsck found problems:\n  " + "\n  ".join(p.line() for p in report.problems))
        self.check_tree(None, self.model.files, f"{when}: live tree")
        snaps = {sn.name: sn for sn in s.snapshot_list()}
        if set(snaps) != set(self.model.snaps):
            self.fail(f"{when}: snapshots {sorted(snaps)}, expected {sorted(self.model.snaps)}")
        for name, sn in snaps.items():
            self.check_tree(sn.gen, self.model.snaps[name], f"{when}: snapshot {name}")

    def check_changed(self, op: Op) -> None:
        """After an operation returned: the files it changed read back as the model says."""
        assert self.store is not None and self.disk is not None
        before, after = op.states[0].files, op.states[-1].files
        for p, want in after.items():
            if before.get(p) is not want:
                try:
                    have = self.store.read_file(p)
                except Exception as e:  # noqa: BLE001
                    self.fail(f"after '{op.desc}': reading {p} raised {type(e).__name__}: {e}")
                if have != want:
                    self.fail(f"after '{op.desc}': {p} reads {len(have)} bytes, expected {len(want)} (no crash yet)")
                self.stats.bytes_verified += len(want)

    def check_tree(self, gen: int | None, expected: dict[str, bytes], what: str) -> None:
        assert self.store is not None
        s = self.store
        got: dict[str, bytes] = {}
        dirs: list[str] = []

        def walk(ino: int, prefix: str) -> None:
            for name, attr in s.readdir(ino, gen):
                p = f"{prefix}/{name.decode()}"
                if attr.is_dir:
                    dirs.append(p)
                    walk(attr.ino, p)
                else:
                    with s.open_reader(attr.ino, gen) as r:
                        got[p] = r.read(0, r.size)
                    if attr.size != len(got[p]):
                        self.fail(f"{what}: {p} has size {attr.size} but reads {len(got[p])} bytes")

        walk(ROOT_INO, "")
        if sorted(dirs) != DIRS:
            self.fail(f"{what}: directories {sorted(dirs)}, expected {DIRS}")
        if set(got) != set(expected):
            self.fail(f"{what}: files {sorted(got)}, expected {sorted(expected)}")
        for p, want in expected.items():
            have = got[p]
            if have != want:
                diff = next((i for i in range(min(len(have), len(want))) if have[i] != want[i]), min(len(have), len(want)))
                self.fail(
                    f"{what}: {p} differs: expected {len(want)} bytes, got {len(have)}, first difference at offset {diff}"
                    f" (expected {want[diff:diff + 16].hex() or 'EOF'}, got {have[diff:diff + 16].hex() or 'EOF'})"
                )
            self.stats.bytes_verified += len(want)

    def execute(self, monkeypatch) -> Stats:  # type: ignore[no-untyped-def]
        rng = self.rng
        Store.init(self.root, device=self.device, segment_size=SEGMENT_SIZE)
        self.disk = Disk(self.root / "segments", random.Random(self.seed * 1_000_003 + 7))
        install(monkeypatch, self.disk)
        batch = rng.choice([session_mod.BATCH, 1 * MiB, 256 * KiB])
        monkeypatch.setattr(session_mod, "BATCH", batch)
        self.trace.append(f"device={self.device} batch={batch}")
        self.store = Store.open(self.root)
        for d in DIRS:
            self.store.mkdir(ROOT_INO, d.strip("/").encode())
        while self.stats.crashes < self.target:
            long = rng.random() < LONG_CHANCE
            self.disk.arm(rng.randint(SHORT_SPAN, LONG_SPAN) if long else rng.randint(1, SHORT_SPAN))
            op = None
            try:
                while True:
                    op = choose_op(rng, self.model)
                    start = len(self.disk.committed)
                    self.trace.append(op.desc)
                    try:
                        op.run(self)
                    except PowerLoss:
                        raise
                    except Exception as e:  # noqa: BLE001
                        self.fail(f"'{op.desc}' raised {type(e).__name__}: {e}")
                    self.stats.ops += 1
                    self.model = op.states[-1]
                    self.check_changed(op)
            except PowerLoss:
                assert op is not None
                self.disk_site = self.disk.crash_site
                done = sum(1 for t in self.disk.committed[start:] if t in op.txns)
                if done >= len(op.states):
                    self.fail(f"{op.desc}: {done} of its transactions committed, expected at most {len(op.states) - 1}")
                self.model = op.states[done]
                if 0 < done < len(op.states) - 1:
                    self.stats.partial += 1
                self.stats.crashes += 1
                self.stats.interrupted[op.desc.split()[0]] += 1
                self.trace.append(f"   crash at {self.disk_site} ({done}/{len(op.states) - 1} transactions committed)")
                op_site = self.disk_site
                self.drop()
                self.power_loss()
                again = self.reopen_after_crash()
                more = f", then {again} more during recovery (last at {self.disk_site})" if again else ""
                self.verify(f"after power loss at {op_site} during '{op.desc}'{more}")
                self.stats.recovered = self.stats.crashes
        # finally: gc reclaims all garbage the crashes left, and a clean close/open keeps everything
        self.disk.disarm()
        assert self.store is not None
        self.store.gc()
        report = self.store.fsck()
        if not report.clean or report.unreferenced_bytes:
            self.fail(f"after final gc: clean={report.clean} unreferenced_bytes={report.unreferenced_bytes}")
        self.store.close()
        self.store = Store.open(self.root)
        self.verify("after the final clean reopen")
        self.store.close()
        self.store = None
        self.stats.sites.update(self.disk.sites)
        shutil.rmtree(self.root, ignore_errors=True)
        return self.stats


def run_many(tmp_path: Path, monkeypatch, device: str, total: int, first_seed: int) -> Stats:  # type: ignore[no-untyped-def]
    env_seed = os.environ.get("COWFS_POWERLOSS_SEED")
    per_run = int(os.environ.get("COWFS_POWERLOSS_CRASHES", CRASHES_PER_RUN))
    seeds = [int(env_seed)] if env_seed else [first_seed + i for i in range((total + per_run - 1) // per_run)]
    total_stats = Stats()
    t0 = time.monotonic()
    for seed in seeds:
        run = Run(tmp_path, device, seed, per_run)
        try:
            total_stats.add(run.execute(monkeypatch))
        except BaseException:
            print(f"power-loss: failing run device={device} seed={seed}")
            raise
        finally:
            if run.store is not None:
                try:
                    run.disk.disarm()  # type: ignore[union-attr]
                    run.drop()
                except BaseException:
                    pass
    dt = time.monotonic() - t0
    st = total_stats
    print(
        f"\npower-loss[{device}]: {st.crashes} crash points ({st.in_recovery} during recovery),"
        f" {st.recovered} recovered, {st.bytes_verified} bytes verified, {st.ops} operations completed,"
        f" {len(seeds)} runs, {dt:.1f} s"
    )
    print(f"  modes {dict(st.modes)}; interrupted ops {dict(st.interrupted)}; {st.partial} cut between their transactions")
    print(f"  crash sites {dict(sorted(st.sites.items()))}")
    print(f"  disk effects {dict(sorted(st.disk.items()))}")
    assert st.recovered == st.crashes
    return st


SEEDS = {"file": 1000, "direct": 3000, "pmem": 5000}


@pytest.mark.long
@pytest.mark.parametrize("device", ["file", "direct", "pmem"])
def test_power_loss(tmp_path, monkeypatch, device):
    run_many(tmp_path, monkeypatch, device, CI_CRASHES_PER_DEVICE, SEEDS[device])


@pytest.mark.slow
@pytest.mark.parametrize("device", ["file", "direct", "pmem"])
def test_power_loss_many(tmp_path, monkeypatch, device):
    run_many(tmp_path, monkeypatch, device, SLOW_CRASHES_PER_DEVICE, SEEDS[device] + 100_000)
