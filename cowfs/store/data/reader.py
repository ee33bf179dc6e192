"""Reading a committed version: whole chunks read in windows, read ahead for sequential readers.

A read is served from windows. Window k holds the whole chunks covering file bytes
[k * WINDOW, (k + 1) * WINDOW): one `read_run` (a preadv) per run of records that lie back to
back in a segment, their headers checked as they arrive, and every payload verified by the
thread that loads the window, before any read is served from it: a raw payload against the
CRC32 its record header carries (`_native.crc32_mismatch`, one call per run with the GIL
released, so the loader needs the GIL once per run rather than once per chunk, and the
FUSE thread only slices replies), an encoded one by the BLAKE3 of its decoded bytes (its
chunk id). A window with a damaged chunk fails to load; a read then loads just its own
range, so only reads of the damaged chunk fail.

While window k is read, windows k + 1 .. k + ahead are loaded by `prefetch` (a thread pool's
submit), and each load tells the device (`advise`) to start reading the window `ahead` after
it. `ahead` starts at AHEAD and grows by one, up to the reader's `ahead_limit`, each time a
read has to wait for a window that is already being loaded: the loads are then slower than
the reader (windows of old checkpoints decode several records per piece), and more of them
at once use more of the pool's threads. The kernel's read-ahead sends several READs at once
and they arrive out of order, so windows are found by index, not by the last read. A read
far from the last one reads just its own chunks. A reader keeps the window before the one
being read and `ahead` after it: about (ahead + 2) * WINDOW bytes while it is read
sequentially.
"""
from __future__ import annotations

import contextlib
import struct
import threading
from concurrent.futures import Future
from typing import Callable, Iterator

from ... import _native
from ...errors import CorruptData
from ..log.buffers import BufferPool, uninitialised
from ..log.chains import Item
from ..log.records import MAX_PAYLOAD, MAX_RUN
from .content import Extent, VersionId, find_extent
from .spans import range_spans, widen, zero_fill

# read_run(segment, offset, [(chunk id, destination)], verify) -> the payload CRC32s of the
# records back to back from offset
ReadRun = Callable[[int, int, list[tuple[bytes, memoryview]], bool], list[int]]
CheckChunk = Callable[[bytes, memoryview], None]  # raises CorruptData unless BLAKE3(data) == id
# decode([(chunk id, location, payload, dest)]): encoded records' raw bytes into their dests, not yet verified
Decode = Callable[[list[Item]], None]  # Log.decode_many
Prefetch = Callable[..., "Future[Window]"]  # an executor's submit
Advise = Callable[[int, int, int], None]  # advise(segment, offset, bytes): they will be read soon

WINDOW = 4 << 20  # bytes of a window (the kernel sends READs of up to 1 MiB)
AHEAD = 2  # windows loaded ahead of the one being read, at first (a reader's `ahead`)
MOST_AHEAD = 8  # what a store's readers grow `ahead` to at most (and to twice its read-ahead threads)
INTO_AHEAD = 8  # spans of read_into the device is asked to read before they are loaded


WINDOW_BUFFER = WINDOW + (1 << 20)  # a pooled window buffer: a window plus the chunks straddling its borders


class Window:
    """Verified bytes of a version from file offset `base`.

    `users` (guarded by the reader's lock) counts reads serving from it; a window dropped by
    its reader goes back to the pool when the last of them is done."""

    def __init__(self, base: int, data: memoryview) -> None:
        self.base = base
        self.data = data
        self.users = 0
        self.dropped = False
        self.recycled = False

    def recycle(self, pool: BufferPool[bytearray] | None) -> None:
        """(no users left) Give the buffer back to `pool`."""
        buf = self.data.obj
        self.recycled = True
        try:
            self.data.release()
        except BufferError:  # something still holds this very view: leave the buffer to it
            return
        if pool is not None and isinstance(buf, bytearray):
            pool.give(buf)

    @property
    def end(self) -> int:
        return self.base + len(self.data)

    def serve(self, offset: int, end: int) -> memoryview:
        """Bytes [offset, end), which it must hold."""
        return self.data[offset - self.base:end - self.base]


class FileReader:
    """Reads one committed version (thread-safe); see the module docstring."""

    def __init__(self, extents: list[Extent], size: int, read_run: ReadRun, check: CheckChunk,
                 on_close: Callable[[], None] | None = None, version: VersionId | None = None,
                 prefetch: Prefetch | None = None, advise: Advise | None = None,
                 buffers: BufferPool[bytearray] | None = None, decode: Decode | None = None,
                 ahead_limit: int = AHEAD) -> None:
        self.extents = extents
        self.size = size
        self.version = version
        self._starts = [e.offset for e in extents]
        self._ends = {e.end for e in extents}
        self._read_run = read_run
        self._check = check
        self._prefetch = prefetch
        self._advise = advise
        self._buffers = buffers
        self._decode = decode
        self._on_close = on_close
        self._lock = threading.Lock()  # guards the fields below; never held during I/O
        self._windows: dict[int, Future[Window]] = {}
        self._last = -2  # window index of the last read
        self.ahead = AHEAD  # windows loaded ahead of a sequential read (grows: the module docstring)
        self._ahead_limit = max(AHEAD, ahead_limit)
        self._loaded_ahead: set[int] = set()  # windows submitted ahead of the reads, not read yet
        self._closed = False

    # -- the three ways to read -------------------------------------------------------

    def read(self, offset: int, length: int) -> bytes | memoryview:
        """Bytes [offset, offset + length) (fewer at the end of the file), waiting for I/O."""
        end = min(offset + length, self.size)
        if offset >= end:
            return b""
        with self._named_errors():
            mine: list[tuple[int, Future[Window]]] = []
            with self._lock:
                futures = self._plan(offset, end, mine)
            for k, f in mine:  # windows nobody was loading: load them here
                try:
                    f.set_result(self._load_window(k))
                except BaseException as e:
                    f.set_exception(e)
            if futures is not None:
                try:
                    windows = [f.result() for f in futures]
                    with self._lock:  # a window dropped and recycled since _plan: not served
                        usable = not any(w.recycled for w in windows)
                        for w in windows if usable else []:
                            w.users += 1
                    if usable:
                        return self._serve_in_use(windows, offset, end)
                except CorruptData:
                    if not any(f.exception() is not None for f in futures):
                        raise  # a damaged chunk within [offset, end)
            # a read far from the last, a window that failed to load (a damaged record
            # somewhere in it) or one already recycled: read what is asked for alone, so only
            # its own chunks count
            return self._serve([self._load_range(offset, end)], offset, end)

    def read_alone(self, offset: int, length: int) -> bytes | memoryview:
        """Bytes [offset, offset + length) read from their own chunks only: no window, nothing
        read ahead (for a parser that reads a header here and a directory there)."""
        end = min(offset + length, self.size)
        if offset >= end:
            return b""
        with self._named_errors():
            return self._serve([self._load_range(offset, end)], offset, end)

    def cached(self, offset: int, length: int) -> bytes | memoryview | None:
        """The bytes if their windows are loaded, without waiting for any I/O (for a caller that
        must not block; it verifies their chunks); None if it has to wait."""
        end = min(offset + length, self.size)
        if offset >= end:
            return b""
        first, last = offset // WINDOW, (end - 1) // WINDOW
        with self._lock:
            futures = [self._windows.get(k) for k in range(first, last + 1)]
            if any(f is None or not f.done() or f.exception() is not None for f in futures):
                return None
            windows = [f.result() for f in futures if f is not None]
            for w in windows:
                w.users += 1
            self._loaded_ahead.difference_update(range(first, last + 1))  # there in time
            self._note_read(first, last)
        with self._named_errors():
            return self._serve_in_use(windows, offset, end)

    def fetch(self, offset: int, length: int) -> list[Future[Window]] | None:
        """Start loading (in the prefetch pool) the windows a read needs, without waiting; their
        futures, after which `cached` serves it. None: this read is not served from windows
        (a jump, or no pool): use `read`."""
        end = min(offset + length, self.size)
        if offset >= end or self._prefetch is None:
            return None
        with self._lock:
            return self._plan(offset, end, None)

    def read_into(self, dest: memoryview, prepare: Callable[[memoryview], None] | None = None) -> None:
        """The whole version into `dest` (`size` bytes), each chunk checked as every read is:
        `read_ranges_into` of the one range [0, size)."""
        if len(dest) != self.size:
            raise ValueError(f"read_into needs {self.size} bytes, not {len(dest)}")
        self.read_ranges_into(dest, [(0, self.size)] if self.size else [], prepare)

    def widen(self, ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """`ranges` as `read_ranges_into` takes them (spans.widen)."""
        return widen(self.extents, self._starts, self.size, ranges)

    def read_ranges_into(self, dest: memoryview, ranges: list[tuple[int, int]],
                         prepare: Callable[[memoryview], None] | None = None) -> None:
        """The version's bytes of `ranges` (as `widen` makes them: [lo, hi) sorted, apart, not
        ending inside a chunk) into `dest`, back to back, each chunk checked as every read is;
        holes are zeros. Spans of about WINDOW bytes that begin at extent starts are read
        straight into their place by the read-ahead pool's threads at once, the device asked to
        read INTO_AHEAD spans ahead of them. `prepare(part)` is called on each span's part of
        `dest` by the thread that loads it, before it does (a memfd's pages are made there, on
        every thread at once). A damaged chunk raises CorruptData, after every span has
        finished with `dest`."""
        need = sum(hi - lo for lo, hi in ranges)
        if len(dest) != need:
            raise ValueError(f"read_ranges_into needs {need} bytes, not {len(dest)}")
        spans = range_spans(self.extents, self._starts, self.size, self._ends, ranges, WINDOW,
                            lambda lo, hi: zero_fill(dest, lo, hi))

        def advise(i: int) -> None:
            if i < len(spans):
                self._advise_range(*spans[i][:2])

        def load(i: int) -> None:
            advise(i + INTO_AHEAD)  # the device reads ahead of the spans being loaded
            lo, hi, d = spans[i]
            if prepare is not None:
                prepare(dest[d:d + hi - lo])
            read_window(self.extents, self._starts, self.size, self._read_run, self._check, lo, hi,
                        lambda n: dest[d:d + n], self._decode)  # type: ignore[arg-type, return-value]

        with self._named_errors():
            for i in range(min(INTO_AHEAD, len(spans))):
                advise(i)
            if self._prefetch is None or len(spans) < 2:
                for i in range(len(spans)):
                    load(i)
                return
            futures = [self._prefetch(load, i) for i in range(len(spans))]
            errors = [f.exception() for f in futures]  # (waits for all: none writes to dest after)
            for e in errors:
                if e is not None:
                    raise e.with_traceback(None)  # (its frames hold views of dest)

    # -- windows ------------------------------------------------------------------------

    def _plan(self, offset: int, end: int, mine: list[tuple[int, Future[Window]]] | None) -> list[Future[Window]] | None:
        """(lock held) The futures of the windows covering [offset, end), made where missing:
        appended to `mine` for the caller to load, or given to the prefetch pool if `mine` is
        None. None if the read is far from the last one (not served from windows)."""
        first, last = offset // WINDOW, (end - 1) // WINDOW
        if not (self._last - 1 <= first <= self._last + 1 or first == 0) or self._closed:
            self._last = last
            return None
        futures = []
        for k in range(first, last + 1):
            f = self._windows.get(k)
            if f is not None and k in self._loaded_ahead and not f.done() and self.ahead < self._ahead_limit:
                self.ahead += 1  # a window loaded ahead is not there yet: the loads lag behind the reads
            self._loaded_ahead.discard(k)
            if f is None:
                if mine is None:
                    assert self._prefetch is not None
                    f = self._prefetch(self._load_window, k)
                else:
                    f = Future()
                    f.set_running_or_notify_cancel()
                    mine.append((k, f))
                self._windows[k] = f
            futures.append(f)
        self._note_read(first, last)
        return futures

    def _note_read(self, first: int, last: int) -> None:
        """(lock held) A read of windows first..last: drop loaded windows behind and far ahead
        of it, and, if reads go forward, load the next `ahead` windows."""
        forward = first >= self._last
        self._last = max(last, self._last) if forward else last
        for k in [k for k in self._windows if k < first - 1 or k > last + self.ahead]:
            if self._windows[k].done():
                self._drop(self._windows.pop(k))
                self._loaded_ahead.discard(k)
        if not forward or self._prefetch is None or self._closed:
            return
        for nxt in range(last + 1, last + 1 + self.ahead):
            if nxt * WINDOW >= self.size:
                break
            if nxt not in self._windows:
                self._windows[nxt] = self._prefetch(self._load_window, nxt)
                self._loaded_ahead.add(nxt)

    def _load_window(self, k: int) -> Window:
        """Window k; and the device is asked to start reading window k + ahead, so that its load
        (read ahead later) finds the bytes in memory rather than waiting for the disk."""
        hint = k + self.ahead
        if self._prefetch is not None and hint * WINDOW < self.size:
            self._advise_range(hint * WINDOW, (hint + 1) * WINDOW)
        return self._load_range(k * WINDOW, (k + 1) * WINDOW)

    def _advise_range(self, lo: int, hi: int) -> None:
        """Ask the device to start reading the records of the chunks covering [lo, hi)."""
        if self._advise is not None:
            exts, _base, _top = covering(self.extents, self._starts, self.size, lo, hi)
            for seg, at, n, _run in record_runs(exts):
                self._advise(seg, at, n)

    def _load_range(self, lo: int, hi: int) -> Window:
        pool = self._buffers

        def take(n: int) -> bytearray:
            return pool.take() if pool is not None and n <= pool.size else bytearray(n)

        return read_window(self.extents, self._starts, self.size, self._read_run, self._check, lo, hi, take,
                           self._decode)

    def _drop(self, f: Future[Window]) -> None:
        """(lock held) A loaded window leaves the reader: recycled now, or by its last user."""
        if f.cancelled() or f.exception() is not None:
            return
        w = f.result()
        if w.dropped:
            return
        w.dropped = True
        if w.users == 0:
            w.recycle(self._buffers)

    def _serve_in_use(self, windows: list[Window], offset: int, end: int) -> bytes | memoryview:
        """_serve from windows the caller counted in `users`; uncounted after, and a window its
        reader dropped meanwhile is recycled by its last user."""
        try:
            return self._serve(windows, offset, end)
        finally:
            with self._lock:
                for w in windows:
                    w.users -= 1
                    if w.users == 0 and w.dropped:
                        w.recycle(self._buffers)

    def _serve(self, windows: list[Window], offset: int, end: int) -> bytes | memoryview:
        """Bytes [offset, end) from windows that together hold them, in order (neighbours share
        the chunk that straddles their border: it is taken once)."""
        if len(windows) == 1:
            return windows[0].serve(offset, end)
        parts = []
        pos = offset
        for w in windows:
            top = min(end, w.end)
            if pos < top:
                parts.append(w.serve(pos, top))
                pos = top
        return b"".join(parts)

    @contextlib.contextmanager
    def _named_errors(self) -> Iterator[None]:
        """Fill in the version a CorruptData raised inside the block is about."""
        try:
            yield
        except CorruptData as e:
            if self.version is not None and e.ino is None:
                e.ino, e.vid, e.generation = self.version.ino, self.version.vid, self.version.generation
            raise

    # -- lifetime -------------------------------------------------------------------------

    def close(self) -> None:
        """Stop reading ahead, and let go of the version once no load is in flight."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            running = [f for f in self._windows.values() if not f.cancel() and not f.done()]
            for f in self._windows.values():
                if f.done():
                    self._drop(f)
            self._windows.clear()
        release, self._on_close = self._on_close, None
        if release is None:
            return
        if not running:
            release()
            return
        left = [len(running)]
        count_lock = threading.Lock()

        def one_done(_f: object) -> None:
            with count_lock:
                left[0] -= 1
                now = left[0] == 0
            if now:
                release()

        for f in running:
            f.add_done_callback(one_done)

    def __enter__(self) -> "FileReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def covering(extents: list[Extent], starts: list[int], size: int, lo: int, hi: int) -> tuple[list[Extent], int, int]:
    """The extents of the whole chunks covering [lo, hi) (hi clamped to `size`), and the file
    bytes [base, top) they span."""
    hi = min(hi, size)
    i = find_extent(extents, starts, lo)
    j = i
    while j < len(extents) and extents[j].offset < hi:
        j += 1
    base = extents[i].offset if extents else lo
    top = max(extents[j - 1].end if j > i else lo, hi)
    return extents[i:j], base, top


def record_runs(extents: list[Extent]) -> Iterator[tuple[int, int, int, list[Extent]]]:
    """(segment, offset, bytes, extents) for each run of chunk records that lie back to back in
    one segment (at most MAX_RUN records); holes are skipped. An extent whose length is not its
    record's (a damaged catalog) raises CorruptData."""
    run: list[Extent] = []
    seg = at = nxt = -1
    for e in extents:
        if e.chunk is None or e.loc is None:
            continue
        if e.length != e.loc.length or e.length > MAX_PAYLOAD:
            raise CorruptData(f"chunk {e.chunk.hex()[:16]}: its extent at offset {e.offset} is {e.length} bytes "
                              f"but its record {e.loc.length} (damaged catalog)")
        if not (run and e.loc.seg_id == seg and e.loc.offset == nxt and len(run) < MAX_RUN):
            if run:
                yield seg, at, nxt - at, run
            run, seg, at, nxt = [], e.loc.seg_id, e.loc.offset, e.loc.offset
        run.append(e)
        nxt += e.loc.span
    if run:
        yield seg, at, nxt - at, run


_CRC_SPAN = struct.Struct("=QQII")  # one span of _native.crc32_mismatch's table


def read_window(extents: list[Extent], starts: list[int], size: int, read_run: ReadRun, check: CheckChunk,
                lo: int, hi: int, take: Callable[[int], bytearray] = bytearray, decode: Decode | None = None) -> Window:
    """The whole chunks covering [lo, hi) read into one buffer (from `take(n)`, which may hold
    old bytes), headers checked and payloads verified (see the module docstring); holes and
    bytes no extent covers are zeros. An encoded record is read into a buffer of its own and
    decoded straight into its place in the window (`decode`), then checked by `check`."""
    exts, base, top = covering(extents, starts, size, lo, hi)
    buf = memoryview(take(top - base))[:top - base]
    pos = base
    for e in exts:  # zero what no chunk will fill
        if e.chunk is None or e.loc is None:
            continue
        if e.offset > pos:
            zero_fill(buf, pos - base, e.offset - base)
        pos = e.end
    if top > pos:
        zero_fill(buf, pos - base, top - base)
    encoded: list[tuple[Extent, memoryview]] = []
    for seg, at, _n, run in record_runs(exts):
        payloads = [uninitialised(e.loc.stored_len) if e.loc.encoded else buf[e.offset - base:e.end - base]  # type: ignore[union-attr]
                    for e in run]
        crcs = read_run(seg, at, [(e.chunk, p) for e, p in zip(run, payloads)], False)  # type: ignore[misc]
        table = b"".join(_CRC_SPAN.pack(e.offset - base, e.length, crc, 0)
                         for e, crc in zip(run, crcs) if not e.loc.encoded)  # type: ignore[union-attr]
        if table:
            bad = _native.crc32_mismatch(buf, table)
            if bad >= 0:
                e = [e for e in run if not e.loc.encoded][bad]  # type: ignore[union-attr]
                raise CorruptData(f"chunk {e.chunk.hex()[:16]}: payload checksum mismatch "  # type: ignore[union-attr]
                                  f"(segment {seg}, offset {e.loc.offset})")  # type: ignore[union-attr]
        encoded += [(e, p) for e, p in zip(run, payloads) if e.loc.encoded]  # type: ignore[union-attr]
    if encoded:  # decoded together: their delta bases are found and read a level at a time (chains.py)
        if decode is None:
            raise CorruptData(f"chunk {encoded[0][0].chunk.hex()[:16]}: encoded, and this reader cannot decode")  # type: ignore[union-attr]
        items = [(e.chunk, e.loc, p, buf[e.offset - base:e.end - base]) for e, p in encoded]
        decode(items)  # type: ignore[arg-type]
        for chunk, _loc, _p, dest in items:
            check(chunk, dest)  # type: ignore[arg-type]
    return Window(base, buf)
