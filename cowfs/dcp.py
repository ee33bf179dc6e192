"""`cowfs.dcp.Writer(path)` / `cowfs.dcp.Reader(path)`: drop-ins for torch.distributed.checkpoint's
FileSystemWriter / FileSystemReader with `path` inside a cowfs mount, the bytes moved without
FUSE (plugins/dcp_storage.py). Importing this module imports torch."""
from __future__ import annotations

from .plugins.dcp_storage import Reader, Writer

__all__ = ["Reader", "Writer"]
