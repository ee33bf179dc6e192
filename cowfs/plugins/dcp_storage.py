"""torch.distributed.checkpoint storage for cowfs mounts (issue 34): `Writer(path)` and
`Reader(path)` are FileSystemWriter and FileSystemReader whose files' bytes move between the
process and the mount's daemon in memfds instead of FUSE requests (the process's kept
ones where it keeps any: part_memfds.py).

Everything else is the stock classes' own: the same file names and bytes, `.metadata`
written as `.metadata.tmp` and renamed, the same plans, staging (async_save) and threads.
So the result is what a save through the mount makes, and the stock FileSystemReader reads
it. A `.distcp` file is put when DCP closes it (durable then, as its fsync would make it);
a save that fails midway puts nothing for the file it was writing.
"""
from __future__ import annotations

import io
import os
from contextlib import contextmanager
from typing import Any, Iterator

from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem

from .get import open_read
from .put import WRITE_BUFFER, PutStream


class _PutStream(io.BufferedWriter):
    """A file being written: its bytes go to the daemon in parts as they come (put.PutStream),
    and `close` commits them (`fileno()` is the current part's memfd: DCP's fsync of it costs
    nothing, the put is durable)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self._put = PutStream(path)
        self._ended = False
        super().__init__(self._put, WRITE_BUFFER)

    def close(self) -> None:
        if self._ended:
            return
        self._ended = True
        try:
            self.flush()
            self._put.finish()
        except BaseException:
            self._put.abort()
            raise
        finally:
            self._let_go()

    def discard(self) -> None:
        """The save failed while writing this file: nothing is put."""
        if not self._ended:
            self._ended = True
            self._put.abort()
            self._let_go()

    def _let_go(self) -> None:
        try:
            self.detach()  # (what is still buffered goes nowhere: the put is finished or dropped)
        except ValueError:
            pass


class CowfsFileSystem(FileSystem):
    """DCP's FileSystem with files written by puts and read by gets."""

    @contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Iterator[Any]:
        if mode == "wb":
            stream = _PutStream(path)
            try:
                yield stream
            except BaseException:
                stream.discard()
                raise
            stream.close()
        elif mode == "rb":
            with open_read(path, kept=True) as f:  # DCP copies what it reads, then closes the file
                yield f
        else:
            with super().create_stream(path, mode) as f:
                yield f


class Writer(FileSystemWriter):
    """torch.distributed.checkpoint's FileSystemWriter for a directory in a cowfs mount; takes
    the same arguments."""

    def __init__(self, path: str | os.PathLike, *args: Any, **kwargs: Any) -> None:
        super().__init__(path, *args, **kwargs)
        self.fs = CowfsFileSystem()


class Reader(FileSystemReader):
    """torch.distributed.checkpoint's FileSystemReader for a directory in a cowfs mount."""

    def __init__(self, path: str | os.PathLike, *args: Any, **kwargs: Any) -> None:
        super().__init__(path, *args, **kwargs)
        self.fs = CowfsFileSystem()
