"""Ranks of a gloo group as processes: `python -m MODULE ARGS...` per rank, run to the end."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.frameworkutil import OFFLINE_ENV

ROOT = Path(__file__).resolve().parents[2]


def run_ranks(module: str, per_rank: list[list[str]], quiet: bool = False) -> list[int]:
    """Each rank's exit status (-9: killed); the stderr of failed ranks is printed unless `quiet`."""
    env = {**os.environ, **OFFLINE_ENV, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-m", module, *args], env=env, cwd=ROOT, stdin=subprocess.DEVNULL,
                              stderr=subprocess.PIPE) for args in per_rank]
    codes = []
    for p in procs:
        _out, err = p.communicate(timeout=600)
        codes.append(p.returncode)
        if p.returncode not in (0, -9) and not quiet:
            print(err.decode()[-4000:], file=sys.stderr)
    return codes
