"""torch.distributed.checkpoint storage for cowfs mounts (issue 34): `Writer(path)` and
`Reader(path)` are FileSystemWriter and FileSystemReader whose files' bytes move between the
process and the mount's daemon in sealed memfds instead of FUSE requests.

Everything else is the stock classes' own: the same file names and bytes, `.metadata`
written as `.metadata.tmp` and renamed, the same plans, staging (async_save) and threads.
So the result is what a save through the mount makes, and the stock FileSystemReader reads
it. A `.distcp` file is put when DCP closes it (durable then, as its fsync would make it);
a save that fails midway puts nothing for the file it was writing.
"""
from __future__ import annotations

import fcntl
import io
import os
from contextlib import contextmanager
from typing import Any, Iterator

from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem

from .get import open_read
from .put import SEALS, put_memfd


class _PutStream(io.BufferedWriter):
    """A file being written: its bytes go into a memfd, and `close` puts them (fileno() is the
    memfd's: DCP's fsync of it is a no-op, the put is durable). The file itself is opened
    only then: a rank killed while writing leaves nothing behind."""

    def __init__(self, path: str | os.PathLike) -> None:
        self._path = path
        self._memfd = os.memfd_create("cowfs-dcp", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        super().__init__(io.FileIO(self._memfd, "wb", closefd=False), 1 << 20)

    def close(self) -> None:
        if self.closed:
            return
        try:
            super().close()
            fcntl.fcntl(self._memfd, fcntl.F_ADD_SEALS, SEALS)
            put_memfd(self._path, self._memfd)
        finally:
            self._release()

    def discard(self) -> None:
        """The save failed while writing this file: nothing is put."""
        if not self.closed:
            try:
                io.BufferedWriter.close(self)  # (into the memfd, which is dropped)
            except OSError:
                pass
        self._release()

    def _release(self) -> None:
        if self._memfd >= 0:
            os.close(self._memfd)
            self._memfd = -1


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
            with open_read(path) as f:
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
