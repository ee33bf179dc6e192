"""Crash test (issue 5): `python -m tools.crashtest` (tools/crashtest/) kills the mount daemon
with SIGKILL at random moments while a writer saves real torch/safetensors/HF-style checkpoints
into the mount, then checks fsck, every closed version, the live tree and every snapshot after
remounting. The harness runs as a subprocess, so a crash or hang of the harness cannot take
pytest down."""
from __future__ import annotations

import fcntl
import os
import random
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cowfs.mountinfo import mounted_cowfs
from tools.crashtest.oracle import AllowedStates, ends_at

REPO = Path(__file__).resolve().parents[2]  # `python -m tools.crashtest` runs from here


def store_locked(store: Path) -> bool:
    try:
        fd = os.open(store / "lock", os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def run_crashtest(workdir: Path, cycles: int, timeout: float) -> str:
    seed = int(os.environ.get("COWFS_CRASH_SEED", random.randrange(1 << 31)))
    cmd = [sys.executable, "-m", "tools.crashtest", "--cycles", str(cycles), "--seed", str(seed),
           "--workdir", str(workdir)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
                            cwd=REPO)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)  # the harness unmounts and stops its writer and daemon
        try:
            out, _ = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        pytest.fail(f"crashtest (seed {seed}) not done after {timeout:.0f}s; its output:\n{out}")
    finally:
        mnt = workdir / "mnt"
        assert str(mnt) not in mounted_cowfs(), f"the harness left {mnt} mounted"
        assert not store_locked(workdir / "store"), "the harness left a process holding the store (a daemon?)"
    summary = re.search(r"^(\d+)/(\d+) recovered.*$", out, re.M)
    assert proc.returncode == 0 and summary and summary.group(0).startswith(f"{cycles}/{cycles} recovered"), (
        f"crashtest --cycles {cycles} --seed {seed} exited {proc.returncode} "
        f"({summary.group(0) if summary else 'no summary'}); rerun with COWFS_CRASH_SEED={seed}. Output:\n{out}")
    print(out[out.rfind("\nkills: ") + 1:])  # the totals, for the log (pytest -rA / -s)
    return out


def test_harness_model_is_strict():
    """The harness's own rules, without a mount: a snapshot must match the writer's log at a
    moment of its mkdir (not any version ever written), and a rename is all or nothing."""
    A, B, S = "a" * 64, "b" * 64, "c" * 64
    pt, tmp, st = "run/model.pt", "run/m.safetensors.tmp.1", "run/m.safetensors"

    def rec(t, ev, **kw):
        return {"ev": ev, "t": t, "step": 0, "size": 1, "how": "write", **kw}

    records = [rec(1, "begin", path=pt, sha=A), rec(2, "closed", path=pt, sha=A),
               rec(3, "begin", path=pt, sha=B), rec(4, "closed", path=pt, sha=B),
               rec(5, "begin", path=tmp, sha=S), rec(6, "closed", path=tmp, sha=S),
               rec(7, "rename_begin", src=tmp, dst=st), rec(8, "renamed", src=tmp, dst=st)]
    windows = {"before": (0.1, 0.9), "A": (2.1, 2.9), "A|B": (3.5, 3.6), "B": (4.1, 4.9), "A..B": (2.5, 4.5),
               "renaming": (7.1, 7.9), "renamed": (8.1, 9)}
    model = AllowedStates()
    states = model.replay(records, windows)

    def allowed(window, path):
        return states[window].get(path, {None})

    assert allowed("before", pt) == {None}
    assert allowed("A", pt) == {A}
    assert allowed("A|B", pt) == {A, B}
    assert allowed("B", pt) == {B}
    assert allowed("A..B", pt) == {A, B}
    assert allowed("B", st) == {None} and allowed("B", tmp) == {None}
    assert allowed("renaming", tmp) == {S, None} and allowed("renaming", st) == {None, S}
    assert allowed("renamed", tmp) == {None} and allowed("renamed", st) == {S}
    (rn,) = model.renames
    assert model.rename_violation(rn, S, None) is None  # not yet renamed
    assert model.rename_violation(rn, None, S) is None  # renamed
    assert model.rename_violation(rn, S, S) is not None  # both names
    assert model.rename_violation(rn, None, None) is not None  # neither
    assert model.get(pt) == {B} and model.get(st) == {S} and model.get(tmp) == {None}
    # what can end the version at a path (an in-mount prune may expire it only after that)
    assert ends_at(records[2], pt) and ends_at(records[6], tmp) and ends_at(records[6], st)
    assert not ends_at(records[3], pt) and not ends_at(records[4], pt)


@pytest.mark.mount
@pytest.mark.long
@pytest.mark.timeout(420)
def test_crash_6_cycles_all_recover(tmp_path):
    # 6 cycles in make test (a fresh random seed each run, so CI runs add up; 12 made this the
    # suite's longest test, 2-3 minutes on a busy 2-core machine); 100 in the slow test below
    out = run_crashtest(tmp_path / "crash", 6, timeout=360)
    assert "6/6 recovered" in out


@pytest.mark.mount
@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_crash_100_cycles_all_recover(tmp_path):
    out = run_crashtest(tmp_path / "crash", 100, timeout=2200)
    assert "100/100 recovered" in out
