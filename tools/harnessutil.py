"""What the harnesses in tools/ (crashtest, loadtest, bench) and the tests all need:
running the cowfs CLI as a user would, and checksumming files.

Facts about mounts and daemons (mounted_cowfs, daemon_pid, process_alive,
lazy_unmount) are the product's own and live in cowfs.mountinfo.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Sequence


class CliError(RuntimeError):
    """The cowfs CLI exited non-zero; the message has its exit code and its one-line error."""

    def __init__(self, args: tuple[str, ...], result: subprocess.CompletedProcess) -> None:
        out = result.stderr if isinstance(result.stderr, str) else (result.stderr or b"").decode(errors="replace")
        if not out.strip():
            out = result.stdout if isinstance(result.stdout, str) else (result.stdout or b"").decode(errors="replace")
        super().__init__(f"cowfs {' '.join(args)} failed ({result.returncode}): {out.strip()}")
        self.result = result


def run_cowfs(*args: str, check: bool = True, timeout: float = 300, text: bool = True,
              code: Path | None = None, before: Sequence[Path] = ()) -> subprocess.CompletedProcess:
    """Run `python -m cowfs.cli ARGS` with no stdin, output captured; CliError on a non-zero exit
    when `check` is set. `code`: the source tree to run cowfs from (an A/B against another
    commit's worktree; its daemons inherit it), else the one this process imports; `before`:
    directories put before it on PYTHONPATH (another build of a dependency, installed there
    with `pip install --target`)."""
    env = None if code is None else {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, [*before, code]))}
    r = subprocess.run([sys.executable, "-m", "cowfs.cli", *args], capture_output=True, text=text,
                       timeout=timeout, stdin=subprocess.DEVNULL, env=env, cwd=code)
    if check and r.returncode != 0:
        raise CliError(args, r)
    return r


def run_in_tree(code: Path, script: str, *args: str) -> str:
    """`python -c SCRIPT ARGS` with the cowfs of source tree `code` (PYTHONPATH and working
    directory; an A/B arm against another commit's worktree): its standard output.
    SystemExit with the last line of its error output when it fails."""
    r = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(code)}, cwd=code, stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        tail = (r.stderr.strip() or r.stdout.strip()).splitlines()[-1:] or ["(no output)"]
        raise SystemExit(f"the arm in {code} failed: {tail[0]}")
    return r.stdout


def sha_file(path: Path) -> tuple[str, int]:
    """sha256 hex digest and length of a file, read in 1 MiB pieces."""
    h = hashlib.sha256()
    n = 0
    with open(path, "rb", buffering=0) as f:
        while True:
            b = f.read(1 << 20)
            if not b:
                break
            h.update(b)
            n += len(b)
    return h.hexdigest(), n
