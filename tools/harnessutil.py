"""Helpers the test harnesses in tools/ share (they run as scripts, so tools/ is on sys.path)."""
from __future__ import annotations

import hashlib
from pathlib import Path


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
