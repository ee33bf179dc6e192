"""`python -m tools.crashtest` and the harness's own child processes: the writer
(`_writer`) and the history reader (`_inspect`) are hidden subcommands of it, run from the
repository root so that `tools` is importable there."""
from __future__ import annotations

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]  # the cwd of the child processes
WRITER = "_writer"
INSPECT = "_inspect"


def child_argv(subcommand: str, *args: str) -> list[str]:
    """The command line of a child process of the harness (run it with cwd=REPO_ROOT)."""
    return [sys.executable, "-m", "tools.crashtest", subcommand, *args]


def main(argv: list[str] | None = None) -> int:
    """Dispatch: the children import only what they need (the writer: torch; the harness: not)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == WRITER:
        from .writer import main as writer_main
        return writer_main(argv[1:])
    if argv and argv[0] == INSPECT:
        from .inspect_history import main as inspect_main
        return inspect_main(argv[1:])
    try:
        import cowfs  # noqa: F401
    except ImportError:
        print("crashtest: cowfs is not importable: run it with the venv's python (.venv/bin/python)", file=sys.stderr)
        return 2
    from .cli import main as harness_main
    return harness_main(argv)
