"""torch.distributed.checkpoint storage for cowfs mounts (issue 34): `Writer(path)` and
`Reader(path)` are FileSystemWriter and FileSystemReader whose files' bytes move between the
process and the mount's daemon in memfds instead of FUSE requests (the process's kept
ones where it keeps any: part_memfds.py).

Everything else is the stock classes' own: the same file names and bytes, `.metadata`
written as `.metadata.tmp` and renamed, the same plans, staging (async_save) and threads.
So the result is what a save through the mount makes, and the stock FileSystemReader reads
it. A `.distcp` file is put when DCP closes it (durable then, as its fsync would make it);
a save that fails midway puts nothing for the file it was writing. A load gets, of each
file, only the items its plan reads (ranges, widened to whole chunks by the daemon) when
they are under RANGES_BELOW of the file: a model-only load of a checkpoint that holds the
optimizer's state too, or a rank of a resharded load, moves what it uses.
"""
from __future__ import annotations

import bisect
import dataclasses
import io
import os
from concurrent.futures import Future, ThreadPoolExecutor
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


RANGES_BELOW = 0.75  # a file's items got as ranges when they take less than this share of it
RANGE_GAP = 1 << 20  # items closer than this are got as one range
GET_AHEAD = True  # the next file of a load got while one is read (False: each when it is opened)


def coalesced(items: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """(offset, length) items as sorted ranges, those that overlap or lie within RANGE_GAP of
    each other joined."""
    out: list[tuple[int, int]] = []
    for off, n in sorted(items):
        if out and off <= out[-1][0] + out[-1][1] + RANGE_GAP:
            start = out[-1][0]
            out[-1] = (start, max(out[-1][1], off + n - start))
        else:
            out.append((off, n))
    return out


class CowfsFileSystem(FileSystem):
    """DCP's FileSystem with files written by puts and read by gets; `wanted` (set by Reader
    for one read_data, `reading`): path -> the (offset, length) items the plan reads of it.
    While one file of `wanted` is read, the next one (Reader reads them in the order of their
    paths) is got in the background."""

    def __init__(self) -> None:
        super().__init__()
        self.wanted: dict[str, list[tuple[int, int]]] = {}
        self._order: list[str] = []  # the paths of `wanted`, sorted
        self._pool: ThreadPoolExecutor | None = None
        self._ahead: tuple[str, Future] | None = None  # the next file of `wanted`, being got

    @contextmanager
    def reading(self, wanted: dict[str, list[tuple[int, int]]]) -> Iterator[None]:
        """`wanted` for one read_data; afterwards a file got ahead and not read is closed, and
        the thread that got it ends (a process may make a Reader per load)."""
        self.wanted, self._order = wanted, sorted(wanted)
        try:
            yield
        finally:
            self.drop_ahead()
            if self._pool is not None:
                self._pool.shutdown()
                self._pool = None
            self.wanted, self._order = {}, []

    def _open_read(self, path: str) -> Any:
        ranges = coalesced(self.wanted.get(path, []))
        if ranges and sum(n for _o, n in ranges) >= RANGES_BELOW * os.stat(path).st_size:
            ranges = []  # most of the file: got whole
        return open_read(path, kept=True, ranges=ranges or None)  # DCP copies what it reads, then closes

    def _opened(self, path: str) -> Any:
        """`path` open for reading: got ahead, or now; the file after it then got ahead."""
        if self._ahead is not None and self._ahead[0] == path:
            future, self._ahead = self._ahead[1], None
            f = future.result()
        else:
            self.drop_ahead()
            f = self._open_read(path)
        at = bisect.bisect_right(self._order, path)
        if at < len(self._order) and GET_AHEAD:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="cowfs-dcp-ahead")
            self._ahead = (self._order[at], self._pool.submit(self._open_read, self._order[at]))
        return f

    def drop_ahead(self) -> None:
        """A file got ahead that is not read: closed (its memfd back; an error it met unsaid)."""
        if self._ahead is not None:
            future, self._ahead = self._ahead[1], None
            try:
                future.result().close()
            except Exception:
                pass

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
            with self._opened(os.fspath(path)) as f:
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

    def read_data(self, plan: Any, planner: Any) -> Any:
        """FileSystemReader's, with each file's items read in the order they lie in it (the
        plan's order jumps about the file; a file got in windows would get one again for each
        jump back) and `wanted` set for the gets."""
        wanted: dict[str, list[tuple[int, int]]] = {}
        for item in plan.items:
            info = self.storage_data[item.storage_index]
            path = os.fspath(self.fs.concat_path(self.path, info.relative_path))
            wanted.setdefault(path, []).append((int(info.offset), int(info.length)))
        in_place = sorted(plan.items, key=lambda item: (self.storage_data[item.storage_index].relative_path,
                                                        self.storage_data[item.storage_index].offset))
        with self.fs.reading(wanted):
            return super().read_data(dataclasses.replace(plan, items=in_place), planner)
