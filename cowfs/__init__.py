"""cowfs: a FUSE filesystem for versioned ML checkpoints.

`cowfs.save(obj, path)` and `cowfs.load(path)` are torch.save and torch.load for files in a
cowfs mount, the bytes moved between the process and the daemon without FUSE
(cowfs/plugins); `cowfs.dcp.Writer` / `Reader` do the same for torch.distributed.checkpoint
and `cowfs.lightning.CheckpointIO` for Lightning. Importing cowfs does not import torch."""
from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def save(obj: Any, path: Any, **kwargs: Any) -> Any:
    """torch.save(obj, path), durable as one new version when it returns; with
    background=True a future, done once it is (plugins/torch_io.py)."""
    from .plugins.torch_io import save as _save  # noqa: PLC0415 - keeps torch out of `import cowfs`

    return _save(obj, path, **kwargs)


def load(path: Any, **kwargs: Any) -> Any:
    """torch.load(path, **kwargs) (plugins/torch_io.py)."""
    from .plugins.torch_io import load as _load  # noqa: PLC0415

    return _load(path, **kwargs)


def wait_for_saves() -> None:
    """Wait for this process's background saves to commit (plugins/torch_io.py)."""
    from .plugins.torch_io import wait_for_saves as _wait  # noqa: PLC0415

    _wait()


def keep_save_memory(max_bytes: int) -> None:
    """Keep at most `max_bytes` of the memory saves are copied into and DCP loads read from,
    for the next ones (by default a quarter of the memory; 0 keeps none):
    plugins/part_memfds.py."""
    from .plugins.part_memfds import keep_save_memory as _keep  # noqa: PLC0415

    _keep(max_bytes)
