"""`python -m tools.crashtest`: the harness, or one of its hidden child subcommands."""
from __future__ import annotations

import sys

from .subcommands import INSPECT, WRITER


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


if __name__ == "__main__":
    sys.exit(main())
