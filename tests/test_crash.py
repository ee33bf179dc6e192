"""Crash test (issue 5): tools/crashtest.py kills the mount daemon with SIGKILL at random
moments while a writer saves real torch/safetensors/HF-style checkpoints into the mount,
then checks fsck, every closed version, the live tree and every snapshot after remounting.
The harness runs as a subprocess, so a crash or hang of the harness cannot take pytest down."""
from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cowfs.fs.mount import mounted_cowfs

pytestmark = pytest.mark.mount

HARNESS = Path(__file__).resolve().parent.parent / "tools" / "crashtest.py"


def run_crashtest(workdir: Path, cycles: int, timeout: float) -> str:
    seed = int(os.environ.get("COWFS_CRASH_SEED", random.randrange(1 << 31)))
    cmd = [sys.executable, str(HARNESS), "--cycles", str(cycles), "--seed", str(seed), "--workdir", str(workdir)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True)
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
    summary = re.search(r"^(\d+)/(\d+) recovered.*$", out, re.M)
    assert proc.returncode == 0 and summary and summary.group(0).startswith(f"{cycles}/{cycles} recovered"), (
        f"crashtest --cycles {cycles} --seed {seed} exited {proc.returncode} "
        f"({summary.group(0) if summary else 'no summary'}); rerun with COWFS_CRASH_SEED={seed}. Output:\n{out}")
    return out


@pytest.mark.timeout(420)
def test_crash_20_cycles_all_recover(tmp_path):
    out = run_crashtest(tmp_path / "crash", 20, timeout=360)
    assert "20/20 recovered" in out


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_crash_100_cycles_all_recover(tmp_path):
    out = run_crashtest(tmp_path / "crash", 100, timeout=2200)
    assert "100/100 recovered" in out
