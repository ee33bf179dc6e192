"""What a failed check is, and the cowfs CLI run so that its failure is one."""
from __future__ import annotations

import subprocess

from tools.harnessutil import CliError, run_cowfs


class LoadError(Exception):
    """A check failed: the message says what was read and what was expected."""


def cowfs_or_fail(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run the cowfs CLI; a non-zero exit is a LoadError with its message."""
    try:
        return run_cowfs(*args, timeout=timeout)
    except CliError as e:
        raise LoadError(str(e)) from None
