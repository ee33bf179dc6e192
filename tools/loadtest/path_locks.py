"""flocks (in WORKDIR/locks, not on the mount) that keep a read from being open when an
in-place rewrite of the same file opens: such a read may see the writer's bytes, as on ext4."""
from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import Iterator


class PathLocks:
    """flock per (writer, path): readers hold it shared from open to close, writers
    exclusively around open(), so no read is open when an in-place rewrite opens."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @contextlib.contextmanager
    def hold(self, writer: int, rel: str, exclusive: bool) -> Iterator[None]:
        d = self.root / f"w{writer}"
        d.mkdir(parents=True, exist_ok=True)
        fd = os.open(d / (rel.replace("/", "%") + ".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)
