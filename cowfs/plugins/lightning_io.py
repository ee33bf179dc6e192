"""Lightning's CheckpointIO for cowfs mounts (issue 34): checkpoints saved with `cowfs.save`
(a put: no FUSE requests for the bytes, one durable version) and loaded with `cowfs.load`
(a get). `CheckpointIO(background=True)` returns from save_checkpoint once the checkpoint
is copied into memory and commits it in the background; teardown (the end of fit) waits for
those commits and raises the first error."""
from __future__ import annotations

import os
import shutil
from typing import Any, Callable

from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO as _LightningCheckpointIO

from .background import background_puts
from .torch_io import load, save


class CheckpointIO(_LightningCheckpointIO):
    def __init__(self, background: bool = False) -> None:
        super().__init__()
        self.background = background

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__}.save_checkpoint takes no storage_options")
        os.makedirs(os.path.dirname(os.fspath(path)) or ".", exist_ok=True)
        save(checkpoint, path, background=self.background)

    def load_checkpoint(self, path: Any, map_location: Callable | Any | None = None,
                        weights_only: bool | None = None) -> dict[str, Any]:
        if not os.path.exists(path):
            raise FileNotFoundError(f"Checkpoint file not found: {path}")
        if self.background:
            background_puts().wait()  # a checkpoint saved in the background reads back as saved
        return load(path, map_location=map_location, weights_only=weights_only)

    def remove_checkpoint(self, path: Any) -> None:
        if self.background:
            background_puts().wait()  # never remove a file a pending save is about to commit
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        elif os.path.lexists(path):
            os.remove(path)

    def teardown(self) -> None:
        if self.background:
            background_puts().wait()
