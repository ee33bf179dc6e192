"""`save(obj, path)` and `load(path)` for torch.save users (issue 34): the bytes torch.save
writes go to the mount's daemon in a sealed memfd (put.py), not through FUSE; the file reads
back with torch.load like any other (through the mount, for now)."""
from __future__ import annotations

import os
from typing import Any

from .put import put


def save(obj: Any, path: str | os.PathLike, mode: int = 0o666, **torch_save_kwargs: Any) -> None:
    """torch.save(obj) as `path`'s new version, durable when this returns."""
    import torch  # noqa: PLC0415 - torch stays optional: imported only when this is called

    put(path, lambda f: torch.save(obj, f, **torch_save_kwargs), mode)


def load(path: str | os.PathLike, **torch_load_kwargs: Any) -> Any:
    """torch.load of `path` (weights_only, map_location, ... as torch.load takes them)."""
    import torch  # noqa: PLC0415

    return torch.load(path, **torch_load_kwargs)
