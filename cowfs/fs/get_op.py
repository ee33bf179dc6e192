"""A get (fs/bulk_server.py): a file's committed bytes handed to the client in a memfd, without
FUSE READs (issue 34; docs/design.md section 18).

The client (`cowfs.plugins.get`) opens the file through the mount for reading, so the kernel
has checked its permissions, and sends the descriptor. Here the version an open gets (the
committed one, also while a writer has the file open; a snapshot's in a snapshot) is read
straight into a memfd's pages by the read-ahead threads, every chunk checked as every read
is (`FileReader.read_into`). Either the daemon makes the memfd, seals it against any change
and sends it back, or (`"into": true`) it fills one the client sent: a memfd of the
client's, writable and sealed against shrinking (so a mapping of it can never fault past
its end), grown to the file's size if smaller; the client reads the first `size` bytes. A
damaged chunk fails the whole get with EIO and is logged as a read's would be.

With `"ranges": [[OFFSET, LENGTH], ...]` (sorted, apart) only those bytes are read: each
range is widened to the whole chunks it touches, and the widened ranges lie back to back in
the memfd; the reply's `ranges` says which they are (a range past the end is cut there).

The reply's `gen` is the generation whose version was read. A client that reads a file in
several gets (windows of a large file, bytes outside its ranges) sends it back as `"gen": G`
with each later one, so every get reads that same version even if a writer committed a new
one in between (every version stays in the catalog until `cowfs prune` or `expire` drops
it: then ESTALE).
"""
from __future__ import annotations

import errno
import fcntl
import mmap
import os
from typing import TYPE_CHECKING, Any

import trio

from .. import _native
from ..errors import CorruptData, CowfsError, NotFound
from .bulk_target import target_file

if TYPE_CHECKING:
    from ..store.catalog.namespace import Attr
    from ..store.data.reader import FileReader
    from .views import View
    from .operations import CowfsOperations

MAX_RANGES = 256  # ranges one get may name (its request is one line of at most 4096 bytes: bulk_messages.py)
SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL
F_SEAL_FUTURE_WRITE = getattr(fcntl, "F_SEAL_FUTURE_WRITE", 0x0010)  # (Linux 5.1; not in every Python's fcntl)


def memory_available() -> int:
    """MemAvailable from /proc/meminfo, in bytes."""
    with open("/proc/meminfo", "rb") as f:
        for line in f:
            if line.startswith(b"MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def _ranges(header: dict[str, Any]) -> list[tuple[int, int]] | None:
    """The get's `ranges` as [lo, hi) pairs; None: the whole file. EINVAL if malformed."""
    raw = header.get("ranges")
    if raw is None:
        return None
    bad = CowfsError(f'malformed get: "ranges" is a list of at most {MAX_RANGES} [offset, length] pairs of integers, '
                     "length above 0, sorted by offset and not overlapping", errno=errno.EINVAL)
    if not isinstance(raw, list) or len(raw) > MAX_RANGES:
        raise bad
    out: list[tuple[int, int]] = []
    for pair in raw:
        if not (isinstance(pair, list) and len(pair) == 2
                and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in pair)) or pair[1] == 0:
            raise bad
        if out and pair[0] < out[-1][1]:
            raise bad
        out.append((pair[0], pair[0] + pair[1]))
    return out


def _generation(header: dict[str, Any], view: "View") -> int | None:
    """The get's `gen` (None: the version an open gets now). EINVAL if malformed, or if it is
    not the snapshot's own generation where the file is a snapshot's."""
    gen = header.get("gen")
    if gen is None:
        return None
    if not isinstance(gen, int) or isinstance(gen, bool) or gen < 0:
        raise CowfsError('malformed get: "gen" is the generation an earlier get of the file answered',
                         errno=errno.EINVAL)
    if view.gen is not None and gen != view.gen:
        raise CowfsError(f"generation {gen} asked of a snapshot's file, which is at generation {view.gen}",
                         errno=errno.EINVAL)
    return gen


def _pinned(ops: "CowfsOperations", view: "View", ino: int, gen: int | None) -> "tuple[FileReader, Attr, int]":
    """(worker thread) committed_version at `gen`: a generation the store has not reached is
    EINVAL, a version dropped since is ESTALE."""
    if gen is not None and gen > ops.store_of(view).generation:
        raise CowfsError(f"generation {gen} is past this store's newest", errno=errno.EINVAL)
    try:
        return ops.committed_version(view, ino, gen)
    except NotFound:
        if gen is None:
            raise
        raise CowfsError(f"the version the file had at generation {gen} is gone (pruned or expired since): "
                         "open and read it again", errno=errno.ESTALE) from None


def _fill_memfd(reader: "FileReader", ranges: list[tuple[int, int]]) -> int:
    """(worker thread) A sealed memfd holding the reader's bytes of `ranges` (FileReader.widen's)."""
    size = sum(hi - lo for lo, hi in ranges)
    memfd = os.memfd_create("cowfs-get", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        if size:
            os.ftruncate(memfd, size)
            _read_into_memfd(reader, memfd, size, ranges)
        fcntl.fcntl(memfd, fcntl.F_ADD_SEALS, SEALS)  # (no writable mapping is left)
    except BaseException:
        os.close(memfd)
        raise
    return memfd


def _fill_clients_memfd(reader: "FileReader", memfd: int, ranges: list[tuple[int, int]]) -> None:
    """(worker thread) The reader's bytes of `ranges` written into the first bytes of the
    client's memfd (checked by `_clients_memfd`), which is grown to hold them if it is smaller."""
    size = sum(hi - lo for lo, hi in ranges)
    if os.fstat(memfd).st_size < size:
        os.ftruncate(memfd, size)
    if size:
        _read_into_memfd(reader, memfd, size, ranges)


def _clients_memfd(fds: list[int]) -> int:
    """The memfd a get `"into": true` sent to be filled; EINVAL or EPERM if it cannot be."""
    if len(fds) != 1:
        raise CowfsError(f'a get "into" a memfd sends 1 descriptor (the memfd), not {len(fds)}', errno=errno.EINVAL)
    memfd = fds[0]
    if not os.readlink(f"/proc/self/fd/{memfd}").startswith("/memfd:"):  # (no request to any file system)
        raise CowfsError("a get fills a memfd, and this descriptor is none", errno=errno.EINVAL)
    if fcntl.fcntl(memfd, fcntl.F_GETFL) & os.O_ACCMODE != os.O_RDWR:
        raise CowfsError("the memfd must be open for reading and writing", errno=errno.EBADF)
    seals = fcntl.fcntl(memfd, fcntl.F_GET_SEALS)
    if not seals & fcntl.F_SEAL_SHRINK or seals & (fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE | F_SEAL_FUTURE_WRITE):
        raise CowfsError("seal the memfd against shrinking (F_SEAL_SHRINK) and against nothing else before a get "
                         "fills it", errno=errno.EPERM)
    return memfd


def _populate_for_write(part: memoryview) -> None:
    _native.populate(part, True)


def _read_into_memfd(reader: "FileReader", memfd: int, size: int, ranges: list[tuple[int, int]]) -> None:
    # the memfd's pages made and mapped a span at a time, not one fault at a time, by the
    # threads that fill the spans (making shmem pages costs as much as reading them): by
    # populate, which releases the GIL (mmap.mmap with MAP_POPULATE holds it)
    mapping = mmap.mmap(memfd, size, flags=mmap.MAP_SHARED)
    view = memoryview(mapping)
    try:
        reader.read_ranges_into(view, ranges, _populate_for_write)
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
    the mount): the reply carries a sealed memfd of the file's bytes; with `"into": true` and
    a memfd of the client's (`_clients_memfd`), that memfd is filled and the reply carries
    none. The result is their size and the version's id; with `ranges` (see the module
    text), also the ranges the memfd holds, back to back, and their bytes (`filled`)."""
    into = header.get("into", False)
    asked = _ranges(header)
    if not isinstance(into, bool):
        raise CowfsError('malformed get: "into" is true or false', errno=errno.EINVAL)
    if into:
        memfd = _clients_memfd(fds)
    elif fds:
        raise CowfsError(f"a get sends no descriptor (it names the file open for reading through the mount by its "
                         f"number: {{\"fd\": N}}), not {len(fds)}", errno=errno.EINVAL)
    view, ino, _fuse_ino = await target_file(ops, conn, header, writing=False)
    gen = _generation(header, view)
    try:
        reader, attr, gen = await trio.to_thread.run_sync(_pinned, ops, view, ino, gen)
        try:
            ranges = [(0, reader.size)] if asked is None else reader.widen(asked)
            need = sum(hi - lo for lo, hi in ranges)
            if need > memory_available() // 2:
                raise CowfsError(f"the {need} bytes would take more than half of the memory available: read "
                                 f"{'them' if asked else 'the file'} through the mount, or get fewer ranges",
                                 errno=errno.ENOMEM)
            ranges = [(lo, hi) for lo, hi in ranges if hi > lo]
            if into:
                await trio.to_thread.run_sync(_fill_clients_memfd, reader, memfd, ranges)
            else:
                memfd = await trio.to_thread.run_sync(_fill_memfd, reader, ranges)
        finally:
            reader.close()
    except CorruptData as e:
        ops.corrupt_log.report(view, ino, e, "get")
        raise CowfsError(f"damaged data: {e}", errno=errno.EIO) from None
    result: dict[str, Any] = {"size": attr.size, "vid": attr.vid, "gen": gen}
    if asked is not None:
        result.update(ranges=[[lo, hi - lo] for lo, hi in ranges], filled=need)
    return result, [] if into else [memfd]
