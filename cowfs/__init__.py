"""cowfs: a FUSE filesystem for versioned ML checkpoints."""

__version__ = "0.1.0"
