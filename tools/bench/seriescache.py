"""Checkpoint series for the codec benchmark, built once and kept under a work directory.

A bench tool: cowfs/ never imports it. No torch here: the series is built by
tools.bench.trainer_series in a child process.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

MARKER = "series.json"  # written by trainer_series when a series is complete
SERIES = ("bf16", "fp32", "plain-bf16", "plain-fp32")
REPO = Path(__file__).resolve().parents[2]


def ensure(work: Path, name: str, checkpoints: int = 10, save_steps: int = 20) -> Path:
    """WORK/series-NAME, built unless a complete one with `checkpoints` versions is there.
    NAME: bf16, fp32 (Trainer runs), plain-bf16 or plain-fp32 (torch.save to one path)."""
    if name not in SERIES:
        raise ValueError(f"unknown series {name!r}, not one of {SERIES}")
    out = work / f"series-{name}"
    if (out / MARKER).exists():
        info = json.loads((out / MARKER).read_text())
        if len(info.get("versions", [])) == checkpoints:
            return out
    shutil.rmtree(out, ignore_errors=True)
    print(f"building {out} ...", file=sys.stderr)
    subprocess.run(command(name, out, checkpoints, save_steps), check=True, stdout=subprocess.DEVNULL, cwd=REPO)
    return out


def command(name: str, out: Path, checkpoints: int = 10, save_steps: int = 20, *extra: str) -> list[str]:
    """The child command that builds series NAME into `out` (run it with cwd=REPO); `extra`
    are more trainer_series options (--save-times, --info, --one-path)."""
    if name not in SERIES:
        raise ValueError(f"unknown series {name!r}, not one of {SERIES}")
    cmd = [sys.executable, "-m", "tools.bench.trainer_series", "--dtype", name.rsplit("-", 1)[-1],
           "--out", str(out), "--checkpoints", str(checkpoints), "--save-steps", str(save_steps)]
    if name.startswith("plain-"):
        cmd.append("--plain")
    return cmd + list(extra)
