"""A get (fs/bulk_server.py): a file's committed bytes handed to the client in a sealed memfd,
without FUSE READs (issue 34; docs/design.md section 18).

The client (`cowfs.plugins.get`) opens the file through the mount for reading, so the kernel
has checked its permissions, and sends the descriptor. Here the version an open gets (the
committed one, also while a writer has the file open; a snapshot's in a snapshot) is read
straight into a memfd's pages by the read-ahead threads, every chunk checked as every read
is (`FileReader.read_into`); the memfd is sealed against any change and sent back. A damaged
chunk fails the whole get with EIO and is logged as a read's would be.
"""
from __future__ import annotations

import errno
import fcntl
import mmap
import os
from typing import TYPE_CHECKING, Any

import trio

from .. import _native
from ..errors import CorruptData, CowfsError
from .bulk_target import target_file

if TYPE_CHECKING:
    from ..store.data.reader import FileReader
    from .operations import CowfsOperations

SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL


def memory_available() -> int:
    """MemAvailable from /proc/meminfo, in bytes."""
    with open("/proc/meminfo", "rb") as f:
        for line in f:
            if line.startswith(b"MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def _fill_memfd(reader: "FileReader") -> int:
    """(worker thread) A sealed memfd holding the reader's version."""
    size = reader.size
    memfd = os.memfd_create("cowfs-get", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        if size:
            os.ftruncate(memfd, size)
            _read_into_memfd(reader, memfd, size)
        fcntl.fcntl(memfd, fcntl.F_ADD_SEALS, SEALS)  # (no writable mapping is left)
    except BaseException:
        os.close(memfd)
        raise
    return memfd


def _populate_for_write(part: memoryview) -> None:
    _native.populate(part, True)


def _read_into_memfd(reader: "FileReader", memfd: int, size: int) -> None:
    # the memfd's pages made and mapped a span at a time, not one fault at a time, by the
    # threads that fill the spans (making shmem pages costs as much as reading them): by
    # populate, which releases the GIL (mmap.mmap with MAP_POPULATE holds it)
    mapping = mmap.mmap(memfd, size, flags=mmap.MAP_SHARED)
    view = memoryview(mapping)
    try:
        reader.read_into(view, _populate_for_write)
        failure = None
    except BaseException as e:  # its traceback's frames hold views of the mapping: dropped
        failure = e.with_traceback(None)
    try:
        view.release()
        mapping.close()
    except BufferError:  # a view still held somewhere: the mapping goes with it
        pass
    if failure is not None:
        raise failure


async def get(ops: "CowfsOperations", header: dict[str, Any], fds: list[int],
              conn: trio.socket.SocketType) -> tuple[dict[str, Any], list[int]]:
    """{"op": "get", "fd": F} (F: the client's descriptor of the file, open for reading through
    the mount): the reply carries a sealed memfd of the file's bytes; its result is their
    size and the version's id."""
    if fds:
        raise CowfsError(f"a get sends no descriptor (it names the file open for reading through the mount by its "
                         f"number: {{\"fd\": N}}), not {len(fds)}", errno=errno.EINVAL)
    view, ino, _fuse_ino = await target_file(ops, conn, header, writing=False)
    try:
        reader, attr = await trio.to_thread.run_sync(ops.committed_version, view, ino)
        try:
            if reader.size > memory_available() // 2:
                raise CowfsError(f"the file's {reader.size} bytes would take more than half of the memory available: "
                                 f"read it through the mount", errno=errno.ENOMEM)
            memfd = await trio.to_thread.run_sync(_fill_memfd, reader)
        finally:
            reader.close()
    except CorruptData as e:
        ops.corrupt_log.report(view, ino, e, "get")
        raise CowfsError(f"damaged data: {e}", errno=errno.EIO) from None
    return {"size": attr.size, "vid": attr.vid}, [memfd]
