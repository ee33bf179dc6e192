"""Write sessions: writes at any offset become one new version at commit.

Layers, topmost first, that make up the session's view of the file:
  overlay   writes that were not sequential appends (spill file, see overlay.py)
  stream    sequential appends from offset 0: chunked and appended to the log in
            the background, batch by batch, while the caller keeps writing; writes a
            little ahead of the stream's end (the kernel's writeback sends pages
            slightly out of order) wait in a bounded reorder window until the gap
            before them is written, then join the stream (see reorder.py); while the
            stream runs, the overlay holds only patches below its end
  base      the committed version the session started from, up to `base_end`
  zeros     everything else below `size`
Commit turns the view into whole chunks: intact chunks are referenced again,
and only the bytes around changes are re-chunked (see `_materialize`).
"""
from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

from ...errors import InvalidArgument
from ..log.log import Location, Log
from .batch_threads import BatchThreads
from .batches import StreamBatches
from .chunk_writer import ChunkWriter
from .chunking import MIN_CHUNK, CutBatch, Region, StreamChunker, StreamLayout, stream_reader
from .content import ChunkCache, Extent, find_extent
from .index import ChunkIndex
from .overlay import Overlay
from .reorder import Buffer, ReorderWindow, StreamTail

if TYPE_CHECKING:
    from ..catalog.namespace import Attr

BATCH = 8 << 20  # bytes handed to a chunking worker at once
REORDER = 32 << 20  # how far past the stream's end a write may end and still be held
RESENT = 64 << 10  # the stream's last bytes kept to match a write sent again against them
HOLE = 64 << 10  # the widest gap before the reorder window the stream steps over when the window is full


@dataclass(frozen=True)
class Piece:
    """A run of the session's view: from a chunk, the overlay, memory, or zeros."""

    start: int
    length: int
    kind: str  # "chunk" | "overlay" | "memory" | "zero"
    extent: Extent | None = None
    src: int = 0  # offset inside the chunk, spill position, or offset inside `mem`
    mem: bytes = b""

    @property
    def intact_chunk(self) -> bool:
        return self.kind == "chunk" and self.src == 0 and self.extent is not None and self.length == self.extent.length


class WriteSession:
    """One writer's pending version of one regular file. Not thread-safe: one caller at a time."""

    def __init__(
        self,
        ino: int,
        base: list[Extent],
        size: int,
        log: Log,
        index: ChunkIndex,
        executor: ThreadPoolExecutor,
        spill_dir: Path,
        read_chunk: Callable[[bytes, Location], bytes],
        commit_fn: Callable[["WriteSession", list[Extent]], "tuple[Attr | None, list[Extent]]"],
        on_close: Callable[["WriteSession"], None],
        threads: BatchThreads | None = None,
        new_layout: Callable[[], StreamLayout] | None = None,
    ) -> None:
        self.ino = ino
        self._new_layout = new_layout  # tensor files are cut into their pieces as they are written
        self._threads = threads or BatchThreads(1)
        self._log = log
        self._index = index
        self._executor = executor
        self._spill_dir = spill_dir
        self._commit_fn = commit_fn
        self._on_close = on_close
        self._cache = ChunkCache(read_chunk)
        self._lock = threading.Lock()
        self.closed = False
        self._start(base, size)

    def _start(self, base: list[Extent], size: int) -> None:
        self._committed = (base, size)
        self.base = base
        self._base_starts = [e.offset for e in base]
        self.size = size
        self.base_end = size
        self.dirty = False
        self.mtime_ns: int | None = None  # set by the caller to give the next version this mtime
        self.writer = ChunkWriter(self._log, self._index)
        self.overlay = Overlay(self._spill_dir)
        self.streaming = True
        self.stream_pos = 0  # bytes written sequentially from offset 0
        self.stream_end = 0  # once frozen: where the stream's chunks end
        self.chunker = StreamChunker()
        self.layout = self._new_layout() if self._new_layout is not None else None
        self.stream_extents: list[Extent] = []
        self._stream_starts: list[int] = []
        # bytes written after the chunker's carry, as received (joined once, by the worker)
        self.pending: list[bytes | memoryview] = []
        self.pending_len = 0
        self.window = ReorderWindow()  # writes beyond stream_pos
        self.tail = StreamTail(RESENT)  # the stream's last bytes
        # the batches in flight: one cut while the one before it is stored (batches.py)
        self.batches: StreamBatches[list[bytes | memoryview], CutBatch, tuple[int, bytes]] = StreamBatches(
            self._executor, self._threads, lambda data, threads: self._cut(data, False, threads), self._store,
            self.chunker.state, self.chunker.restore)

    # -- the streaming fast path ----------------------------------------------

    def _cut(self, data: list[bytes | memoryview], final: bool, threads: int) -> CutBatch:
        return self.chunker.cut(data, final=final, threads=threads, fixed=self._tensor_regions(data, final))

    def _store(self, batch: CutBatch, threads: int) -> None:
        exts = self.writer.store(batch, threads)
        self.stream_extents.extend(exts)
        self._stream_starts.extend(e.offset for e in exts)

    def _run_batch(self, data: list[bytes | memoryview], final: bool) -> None:
        """Chunk and store one batch here (the last, at commit; none in flight). If storing
        fails (e.g. no space for a new segment), the chunker is put back as it was, so the
        same bytes can be run again."""
        saved = self.chunker.state()
        with self._threads.share() as threads:
            batch = self._cut(data, final, threads)
            try:
                self._store(batch, threads)
            except BaseException:
                self.chunker.restore(saved)
                raise

    def _tensor_regions(self, data: list[bytes | memoryview], final: bool) -> list[Region]:
        """The tensor regions to cut this batch with, as the layout learns them from its bytes
        (the chunker's carry, then `data`)."""
        if self.layout is None:
            return []
        start = self.chunker.offset
        pieces = [self.chunker.carry, *data] if self.chunker.carried else data
        end = start + sum(len(p) for p in pieces)
        self.layout.learn(start, end, stream_reader(pieces, start), final)
        return self.layout.regions(start, end)

    def _raise_failed(self, failed: tuple[BaseException | None, list[list[bytes | memoryview]]]) -> None:
        """A failed batch (StreamBatches.wait): its bytes and those of the batches after it go
        back in front of `pending` (the chunker was put back): the view is unchanged, and
        the error is raised."""
        error, back = failed
        if error is None:
            return
        data = [d for batch in back for d in batch]
        self.pending[:0] = data
        self.pending_len += sum(len(d) for d in data)
        raise error

    def _wait(self) -> None:
        """Wait for every batch in flight; a failure raises (`_raise_failed`)."""
        self._raise_failed(self.batches.wait())

    def _make_room(self) -> None:
        """Wait until the next batch can start; a failure raises (`_raise_failed`)."""
        self._raise_failed(self.batches.make_room())

    def _submit_batch(self) -> None:
        """The first BATCH bytes of `pending` (whole writes) to a worker; the rest waits there
        (joined writes can leave more: a batch stays about BATCH, within the heap's buffers)."""
        self._make_room()
        take, size = 0, 0
        while take < len(self.pending) and size < BATCH:
            size += len(self.pending[take])
            take += 1
        data, self.pending = self.pending[:take], self.pending[take:]
        self.pending_len -= size
        self.batches.submit(data)

    @property
    def ahead_len(self) -> int:
        """Bytes held in the reorder window."""
        return self.window.held

    def _freeze(self) -> None:
        """Leave the fast path: unchunked stream bytes and the reorder window move to the
        overlay, the stream's bytes under the patches already there (those are newer)."""
        self._wait()
        start = self.chunker.offset
        rest = b"".join([self.chunker.carry, *self.pending])
        # first: if the spill file is full, nothing has changed (the held writes lie above `rest`,
        # and writing one again over itself is harmless)
        self.overlay.write_under(start, rest)
        for off, data in self.window.items():
            self.overlay.write(off, data)
        self.pending, self.pending_len = [], 0
        self.window.clear()
        self.tail.clear()
        self.chunker.reset(start)
        self.layout = None
        self.streaming = False
        self.stream_end = start

    def _settle(self) -> None:
        """(lock held) Before the layered view is read or cut: the stream steps over the small
        gaps before held writes (their bytes were never written: the view's lower layers
        give them); a wider gap makes the session leave the fast path."""
        while self.streaming and self.window and self.window.first() - self.stream_pos <= HOLE:
            self._step_over_gap()
        if self.window:
            self._freeze()

    def _step_over_gap(self) -> None:
        """(lock held, streaming, window not empty) Append the view's bytes from the stream's
        end to the first held write (the committed version's, or zeros), and join the held
        writes the stream then reaches. If the gap's own bytes come later, they are a patch."""
        fill = b"".join(self._piece_bytes(p) for p in self._lower(self.stream_pos, self.window.first()))
        self._append(fill, joined=True)
        self._join_ahead()

    def _append(self, data: bytes | memoryview, joined: bool = False) -> None:
        """(lock held, streaming) `data` at stream_pos: into the stream buffer, a batch to a
        worker once BATCH bytes wait. `joined`: bytes held in memory already (the reorder
        window's, a gap's fill): they never wait for room for a batch, but stay in the buffer
        (beyond BATCH, at most the window's REORDER) until the next append finds room.
        Through the mount the FUSE thread awaits the room before the write that needs it
        (`batch_to_wait_for`), so a write whose joins fill two batches does not block it."""
        n = len(data)
        no_room = joined and not self.batches.room()
        if self.pending_len + n >= BATCH and not no_room:
            self._make_room()  # a failed batch raises here, before this write changes anything
        self.pending.append(data)
        self.pending_len += n
        self.stream_pos += n
        self.tail.push(data)
        if self.pending_len >= BATCH and not no_room:
            self._submit_batch()

    def _join_ahead(self) -> None:
        """(lock held, streaming) Held writes the stream has reached join it."""
        while (rest := self.window.reached(self.stream_pos)) is not None:
            if rest:
                self._append(rest, joined=True)  # (a failed batch raises here: the write stays held)
            self.window.pop_first()

    def _write_streaming(self, offset: int, data: Buffer, keep: bool) -> None:
        """(lock held, streaming) A write below the stream's end is a patch in the overlay,
        or nothing if it repeats the stream's bytes where nothing is patched; at the end it is
        appended (`keep`: the object itself, no copy); beyond, held in the reorder window.
        One the window cannot take makes the stream step over a small gap before the window,
        or else leave the fast path."""
        while True:
            if offset < self.stream_pos:
                below = min(len(data), self.stream_pos - offset)
                patched = any(self.overlay.ranges(offset, offset + below))
                if patched or not self.tail.same(self.stream_pos - offset, data):
                    self.overlay.write(offset, memoryview(data)[:below])
                if below == len(data):
                    return
                data, offset = memoryview(data)[below:], self.stream_pos
            if offset == self.stream_pos:
                self._append(data if keep else bytes(data))
                self._join_ahead()
                return
            if self.window.hold(offset, data if keep else bytes(data), self.stream_pos, REORDER):
                return
            if not self.window or self.window.first() - self.stream_pos > HOLE:
                break
            self._step_over_gap()
        self._freeze()
        self.overlay.write(offset, data)

    # -- the caller's operations ------------------------------------------------

    def batch_to_wait_for(self, offset: int, n: int) -> Future | None:
        """What a write of `n` bytes at `offset` may wait for before the next batch can start
        (a batch's cut, or the oldest batch in flight), or None when it need not wait (there
        is room, or the write is a plain append that does not fill the next batch). The FUSE
        thread, which serves every file, awaits it without blocking (`fs.dispatch.wait_future`)
        and then writes: `write` then finds the room."""
        with self._lock:
            wait_for = self.batches.to_wait_for()
            if wait_for is None:
                return None
            plain_append = (self.streaming and not self.window
                            and offset <= self.stream_pos < offset + n
                            and self.pending_len + offset + n - self.stream_pos < BATCH)
            return None if plain_append else wait_for

    def write(self, offset: int, data: bytes | memoryview, borrow: bool = False) -> int:
        """Write `data` at `offset`. `borrow`: the caller promises that `data` (a read-only
        view) stays unchanged until the next commit or abort, so an append keeps the view
        instead of a copy (the put socket's sealed memfd pages)."""
        if offset < 0:
            raise InvalidArgument("negative offset")
        n = len(data)
        if n == 0:
            return 0
        with self._lock:
            self.dirty = True
            if self.streaming:  # bytes (FUSE writes are) and borrowed views are kept, not copied
                self._write_streaming(offset, data, borrow or isinstance(data, bytes))
            else:
                self.overlay.write(offset, data)
            self.size = max(self.size, offset + n)
        return n

    def truncate(self, size: int) -> None:
        if size < 0:
            raise InvalidArgument("negative size")
        with self._lock:
            self.dirty = True
            if size < self.size:
                self._settle()
                if self.streaming and size < self.stream_pos:
                    self._freeze()
                if not self.streaming:
                    self.stream_end = min(self.stream_end, size)
                self.base_end = min(self.base_end, size)
                self.overlay.clip(size)
            self.size = size

    def read(self, offset: int, length: int) -> bytes:
        with self._lock:
            end = min(offset + length, self.size)
            if offset >= end:
                return b""
            self._settle()
            if self.streaming:
                self._wait()
            return b"".join(self._piece_bytes(p) for p in self._pieces(offset, end))

    # -- the layered view -----------------------------------------------------------

    def _stream_layer_end(self) -> int:
        return self.stream_pos if self.streaming else self.stream_end

    def _extent_pieces(self, exts: list[Extent], starts: list[int], a: int, b: int) -> Iterator[Piece]:
        if a >= b or not exts:
            return
        i = find_extent(exts, starts, a)
        pos = a
        while pos < b and i < len(exts):
            e = exts[i]
            lo, hi = max(pos, e.offset), min(b, e.end)
            if lo < hi:
                if e.chunk is None:
                    yield Piece(lo, hi - lo, "zero")
                else:
                    yield Piece(lo, hi - lo, "chunk", e, lo - e.offset)
                pos = hi
            i += 1
        if pos < b:
            yield Piece(pos, b - pos, "zero")

    def _lower(self, a: int, b: int) -> Iterator[Piece]:
        s_end = self._stream_layer_end()
        if a < s_end:
            chunks_end = self.chunker.offset if self.streaming else s_end
            yield from self._extent_pieces(self.stream_extents, self._stream_starts, a, min(b, chunks_end))
            if self.streaming and b > chunks_end:
                mem = b"".join([self.chunker.carry, *self.pending])
                lo, hi = max(a, chunks_end), min(b, s_end)
                if lo < hi:
                    yield Piece(lo, hi - lo, "memory", src=lo - chunks_end, mem=mem)
            a = max(a, s_end)
        if a < b and a < self.base_end:
            hi = min(b, self.base_end)
            yield from self._extent_pieces(self.base, self._base_starts, a, hi)
            a = hi
        if a < b:
            yield Piece(a, b - a, "zero")

    def _pieces(self, a: int, b: int) -> Iterator[Piece]:
        pos = a
        for s, e, spill in self.overlay.ranges(a, b):
            if s > pos:
                yield from self._lower(pos, s)
            yield Piece(s, e - s, "overlay", src=spill)
            pos = e
        if pos < b:
            yield from self._lower(pos, b)

    def _piece_bytes(self, p: Piece) -> bytes:
        if p.kind == "zero":
            return bytes(p.length)
        if p.kind == "memory":
            return p.mem[p.src:p.src + p.length]
        if p.kind == "overlay":
            return self.overlay.read(p.src, p.length)
        assert p.extent is not None and p.extent.chunk is not None and p.extent.loc is not None
        data = self._cache.get(p.extent.chunk, p.extent.loc)
        return bytes(data[p.src:p.src + p.length])

    # -- commit --------------------------------------------------------------------

    def _materialize(self) -> list[Extent]:
        """The final chunk list. Intact chunks are referenced as they are; changed
        regions are re-chunked until the chunker lands on an intact chunk again."""
        self._settle()
        self._wait()
        if self.streaming:  # the stream's last bytes become chunks; if more than the stream makes the file, its
            self._run_batch(self.pending, final=True)  # chunks are the stream layer under the rest
            self.pending, self.pending_len = [], 0
            if not self.overlay and self.base_end <= self.stream_pos and self.size == self.stream_pos:
                return list(self.stream_extents)
            self.streaming, self.stream_end, self.layout = False, self.stream_pos, None
            self.tail.clear()
        out: list[Extent] = []
        chunker = StreamChunker()
        for p in self._pieces(0, self.size):
            if p.intact_chunk and chunker.carried == 0:
                assert p.extent is not None
                out.append(Extent(p.start, p.length, p.extent.chunk, p.extent.loc))
                chunker.reset(p.start + p.length)
                continue
            if p.kind == "zero" and chunker.carried == 0 and p.length >= MIN_CHUNK:
                out.append(Extent(p.start, p.length, None, None))
                chunker.reset(p.start + p.length)
                continue
            for off in range(0, p.length, BATCH):
                n = min(BATCH, p.length - off)
                sub = Piece(p.start + off, n, p.kind, p.extent, p.src + off, p.mem)
                with self._threads.share() as threads:
                    out.extend(self.writer.store(chunker.cut(self._piece_bytes(sub), threads=threads), threads))
            if p.intact_chunk and chunker.offset == p.start:
                assert p.extent is not None
                out.append(Extent(p.start, p.length, p.extent.chunk, p.extent.loc))
                chunker.reset(p.start + p.length)
        out.extend(self.writer.store(chunker.cut([], final=True)))
        return out

    def commit(self) -> "Attr | None":
        """Make the session's view the file's new version (durable when this returns).

        Returns the new attributes, or None when the file no longer exists
        (unlinked while open): then nothing is stored. The session stays open
        and continues from the new version.
        """
        with self._lock:
            if not self.dirty:
                return None
            extents = self._materialize()
            size = self.size
            assert sum(e.length for e in extents) == size, "materialized length mismatch"
            # on failure nothing is dropped: the session keeps its view and its pins, and may retry or abort
            attr, stored = self._commit_fn(self, extents)
            if attr is None:
                # the file is gone: keep the view (and the pins on its chunks) until the session closes
                self.dirty = False
                return None
            self.overlay.close()
            self.writer.release()
            self._start(stored, size)
            return attr

    def abort(self) -> None:
        """Drop every uncommitted change: the session is back at its last committed version."""
        with self._lock:
            try:
                self._wait()
            except Exception:
                pass
            self.overlay.close()
            self.writer.release()
            self._start(self._committed[0], self._committed[1])

    def close(self) -> None:
        if self.closed:
            return
        self.abort()
        self.closed = True
        self._on_close(self)


class SessionHandle:
    """A WriteSession usable as a context manager (closing aborts what was not committed)."""

    def __init__(self, session: WriteSession) -> None:
        self.session = session

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self.session, name)

    def __enter__(self) -> WriteSession:
        return self.session

    def __exit__(self, *exc: object) -> None:
        self.session.close()
