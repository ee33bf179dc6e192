"""`save(obj, path)` and `load(path)` for torch.save users (issue 34): the bytes torch.save
writes go to the mount's daemon in memfds (put.py), not through FUSE, now or in the
background (background.py); load reads a sealed memfd the daemon filled (get.py)."""
from __future__ import annotations

import os
from concurrent.futures import Future
from typing import Any

from .background import background_puts
from .get import is_memfd, open_read
from .put import put


def save(obj: Any, path: str | os.PathLike, mode: int = 0o666, background: bool = False,
         **torch_save_kwargs: Any) -> "Future[bool] | None":
    """torch.save(obj) as `path`'s new version, durable when this returns; or, with
    `background`, once the returned future is done: the call returns as soon as torch.save
    has written the bytes into memory (tensors changed in place after that do not change
    the save)."""
    import torch  # noqa: PLC0415 - torch stays optional: imported only when this is called

    def fill(f: Any) -> None:
        torch.save(obj, f, **torch_save_kwargs)

    if background:
        return background_puts().submit(path, fill, mode)
    put(path, fill, mode)
    return None


def wait_for_saves() -> None:
    """Wait until every background save of this process so far is committed; raise the first
    error."""
    background_puts().wait()


def load(path: str | os.PathLike, **torch_load_kwargs: Any) -> Any:
    """torch.load of `path` (weights_only, map_location, mmap, ... as torch.load takes them),
    its bytes from the daemon in a sealed memfd. The tensors map that memfd's pages
    (copy-on-write: torch.load's mmap=True, the default here when the bytes came in a memfd,
    which lives in memory, not on a disk) instead of copying them; mmap=False copies (out of
    one of the process's kept memfds, given back when the load returns)."""
    import torch  # noqa: PLC0415

    copied = torch_load_kwargs.get("mmap") is False  # the tensors copied out: a kept memfd may take the bytes
    with open_read(path, kept=copied) as f:
        in_memory = is_memfd(f.fileno())
        if torch_load_kwargs.get("mmap", in_memory):
            return torch.load(f"/proc/self/fd/{f.fileno()}", **{**torch_load_kwargs, "mmap": True})
        return torch.load(f, **torch_load_kwargs)
