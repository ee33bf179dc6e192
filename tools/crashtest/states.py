"""What a path can be, as the checks compare it: DIR, the sha256 of its whole content, or
None (absent); and reading those states from a directory tree."""
from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from tools.harnessutil import sha_file

PathState = str | None  # DIR, a sha256 hex digest, or None (absent)
EMPTY = hashlib.sha256(b"").hexdigest()
DIR = "DIR"
RUN = "run"  # the writer's directory under the mount root
# safetensors' save_file (0.8) writes a `.tmp<random>` sibling before renaming it onto its target
SAVE_FILE_TMP = re.compile(r"\.tmp[A-Za-z0-9]{6}")


def walk_tree(top: Path) -> dict[str, tuple[str, int]]:
    """rel path -> (DIR or sha256, size) of everything under top (no symlinks expected)."""
    out: dict[str, tuple[str, int]] = {}

    def err(e: OSError) -> None:
        raise e

    for dirpath, dirnames, filenames in os.walk(top, onerror=err):
        d = Path(dirpath)
        for name in dirnames:
            out[str((d / name).relative_to(top))] = (DIR, 0)
        for name in filenames:
            out[str((d / name).relative_to(top))] = sha_file(d / name)
    return out
