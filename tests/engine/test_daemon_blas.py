"""The daemon keeps numpy's OpenBLAS to one thread (fs/mount.py BLAS_THREADS_ENV): run_daemon
sets it before anything imports numpy, so OpenBLAS starts no thread per core to spin beside
the first decode. Checked in a child process that runs run_daemon up to opening the store."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

CHILD = r"""
import json, os, sys
from pathlib import Path
from cowfs.fs import mount

class Seen(Exception):
    pass

def open_store(*_a, **_k):
    blas = os.environ.get(mount.BLAS_THREADS_ENV)
    had_numpy = "numpy" in sys.modules
    import numpy
    numpy.ones(4) + 1
    print(json.dumps({"blas": blas, "had_numpy": had_numpy, "tasks": len(os.listdir("/proc/self/task"))}))
    raise Seen()

mount.Store.open = open_store
try:
    mount.run_daemon(Path("/nonexistent-store"), Path("/nonexistent-mnt"), foreground=True, allow_other=False,
                     auto_snapshot=None)
except Seen:
    pass
"""


def _child(env: dict[str, str]) -> dict[str, object]:
    r = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120, check=True, env=env)
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_daemon_starts_numpy_with_one_blas_thread() -> None:
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    seen = _child(env)
    assert seen["blas"] == "1" and seen["had_numpy"] is False, seen
    assert seen["tasks"] == 1, seen  # numpy imported, and no OpenBLAS thread beside the main one


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="OpenBLAS starts no extra thread on one core")
def test_without_it_openblas_starts_threads() -> None:
    """The check above can fail: a child that imports numpy without the setting gets more threads."""
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    r = subprocess.run([sys.executable, "-c", "import os, numpy; numpy.ones(4) + 1; print(len(os.listdir('/proc/self/task')))"],
                       capture_output=True, text=True, timeout=120, check=True, env=env)
    assert int(r.stdout) > 1
