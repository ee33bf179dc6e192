"""`cowfs.lightning.CheckpointIO`: Lightning's CheckpointIO for a cowfs mount, the checkpoints'
bytes moved without FUSE (plugins/lightning_io.py). Importing this module imports lightning
and torch."""
from __future__ import annotations

from .plugins.lightning_io import CheckpointIO

__all__ = ["CheckpointIO"]
