"""The harness's own child processes: the writer (`_writer`) and the history reader
(`_inspect`) are hidden subcommands of `python -m tools.crashtest` (__main__.py), run from
the repository root so that `tools` is importable there."""
from __future__ import annotations

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]  # the cwd of the child processes
WRITER = "_writer"
INSPECT = "_inspect"


def child_argv(subcommand: str, *args: str) -> list[str]:
    """The command line of a child process of the harness (run it with cwd=REPO_ROOT)."""
    return [sys.executable, "-m", "tools.crashtest", subcommand, *args]
