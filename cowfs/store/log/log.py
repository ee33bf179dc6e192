"""The append-only log: a sequence of preallocated segments holding chunk records.

A few head segments take appends, one append at a time each (heads.py: appends
running at once go to different files); the others are read-only. Appends are
batched into one write per segment; `sync()` is the durability point. The commit
transaction then raises each segment's committed end to the end of the records
the new version references. On open, every segment is cut back to its committed
end: whatever lay beyond it was never referenced by a committed version.
"""
from __future__ import annotations

import contextlib
import errno
import mmap
import os
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Callable, Iterator

import blake3

from ...errors import CorruptData, CowfsError, NoSpace
from .chains import Item, LocateMany, decode_batch
from .buffers import staging_pool
from .device import DirectFileSegment, FileSegment, round_up
from .pmem import PmemSegment
from .evicted import EvictedSegments
from .heads import Head, Heads
from .layout import FORMAT_VERSION, StoreConfig, fsync_dir, segment_path
from .records import (
    CODEC_RAW,
    DATA_START,
    HEADER_SIZE,
    RECORD_ALIGN,
    RecordError,
    decode_record_header,
    encode_segment_header,
    record_parts,
    Location,
    record_span,
)


# the chunks columns a Location is built from (Location(*row) after any leading columns)
LOCATION_COLS = "seg_id, offset, stored_len, codec, raw_len"


def location(seg_id: int, offset: int, stored_len: int, codec: int, raw_len: int) -> Location:
    """A Location from a chunks row (raw records get raw_len None)."""
    return Location(seg_id, offset, stored_len, codec, None if codec == CODEC_RAW else raw_len)


def check_chunk(chunk_id: bytes, data: bytes | memoryview) -> None:
    """Raise CorruptData unless `data` hashes to `chunk_id`. The payload's BLAKE3 must equal
    the chunk id, which catches all the payload CRC would, so reads do not compute that CRC
    (it is there for scans, which have no id to compare with)."""
    if blake3.blake3(data).digest() != chunk_id:
        raise CorruptData(f"chunk {chunk_id.hex()[:16]}: content hash mismatch")


def segment_class(device: str) -> type[FileSegment]:
    """The segment class of a store's device (docs/design.md, "Devices")."""
    return {"pmem": PmemSegment, "direct": DirectFileSegment}.get(device, FileSegment)


# staged batches (data/chunk_writer.py): a write batch (8 MiB, plus up to a 1 MiB write and the
# 256 KiB carry) with its record headers fits one pooled buffer; a buffer per batch running at once
STAGING_BUFFER = 12 << 20
STAGING_KEEP = 16
ALIGNED_MIN = 256 << 10  # staged records from this many bytes start on a block boundary (direct segments)


class Log:
    def __init__(
        self,
        root: Path,
        config: StoreConfig,
        new_segment_id: Callable[[], int],
        heads: int = 1,
    ) -> None:
        self.root = root
        self.config = config
        self._new_segment_id = new_segment_id
        self._seg_cls = segment_class(config.device)
        self._lock = threading.Lock()  # the maps below (appends into a head hold that head's lock)
        self._sync_lock = threading.Lock()  # a sync returns only after every earlier append is durable
        self._open: dict[int, FileSegment] = {}
        self._heads = Heads(heads)
        self._unsynced: set[int] = set()
        self._ends: dict[int, int] = {}  # where the records appended so far end, per segment
        self.locate: Callable[[bytes], Location | None] | None = None  # a chunk id's catalog location (Store sets it)
        self.locate_many: LocateMany | None = None  # the same for many ids, in one query (Store sets it)
        self.evicted: EvictedSegments | None = None  # segments kept only in the bucket (Store sets it)
        self._use_lock = threading.Lock()  # reads in flight per segment, so an evicted file closes after them
        self._readers: Counter[int] = Counter()
        self._retired: dict[int, list[FileSegment]] = {}
        self._staging = staging_pool(STAGING_BUFFER, keep=STAGING_KEEP)

    # -- segments ---------------------------------------------------------

    def segment(self, seg_id: int) -> FileSegment:
        seg = self._open.get(seg_id)
        if seg is not None:
            return seg
        path = segment_path(self.root, seg_id)
        with self._lock:
            seg = self._open.get(seg_id)
            if seg is None and path.exists():
                try:
                    seg = self._open[seg_id] = self._seg_cls.open(path)
                except CowfsError as e:
                    if e.errno != errno.ENOENT:
                        raise
                    seg = None  # evicted meanwhile (evict.py deletes the file, then drops it here)
        if seg is not None:
            return seg
        # an evicted segment, opened outside the lock: the first may build the pack reader
        evicted = self.evicted.open(seg_id) if self.evicted is not None else None
        if evicted is None:
            raise CorruptData(f"segment {seg_id} is missing ({path.name})")
        with self._lock:
            return self._open.setdefault(seg_id, evicted)  # type: ignore[arg-type, return-value]

    def forget_segment(self, seg_id: int) -> None:
        with self._lock:
            seg = self._open.pop(seg_id, None)
            if seg is not None:
                seg.close()

    def drop_evicted(self, seg_id: int) -> None:
        """Read segment `seg_id` from its eviction map from now on. Its file is closed now, or
        by the last read in flight on it (`read_run` counts them)."""
        with self._lock:
            seg = self._open.pop(seg_id, None)
        if seg is None:
            return
        with self._use_lock:
            if self._readers[seg_id]:
                self._retired.setdefault(seg_id, []).append(seg)
                return
        seg.close()

    def _enter(self, seg_id: int) -> None:
        with self._use_lock:
            self._readers[seg_id] += 1

    def _leave(self, seg_id: int) -> None:
        done: list[FileSegment] = []
        with self._use_lock:
            self._readers[seg_id] -= 1
            if not self._readers[seg_id]:
                del self._readers[seg_id]
                done = self._retired.pop(seg_id, [])
        for seg in done:
            seg.close()

    def _rotate(self, head: Head, need: int) -> None:
        """Give `head` (held) a new segment big enough for `need` bytes of records."""
        size = max(self.config.segment_size, round_up(DATA_START + need))
        seg_id = self._new_segment_id()
        seg = self._seg_cls.create(segment_path(self.root, seg_id), size)
        seg.write(0, encode_segment_header(seg_id, self.config.store_uuid, time.time_ns(), FORMAT_VERSION))
        seg.persist()
        fsync_dir(self.root / "segments")
        with self._lock:
            self._open[seg_id] = seg
            self._ends[seg_id] = DATA_START
        head.seg, head.seg_id, head.end = seg, seg_id, DATA_START

    def _appended(self, head: Head, end: int) -> None:
        """Records were written into `head`'s segment up to `end` (a sync makes them durable)."""
        head.end = end
        with self._lock:
            self._ends[head.seg_id] = end
            self._unsynced.add(head.seg_id)

    def _into_a_head(self, append: Callable[[Head], list[Location]]) -> list[Location]:
        """Run `append` with a head of its own. A head opened for it whose segment finds no
        room (NoSpace before anything was written) is given up, and the append waits for
        the first head instead, as it would with one head."""
        with self._heads.take() as head:
            if head.seg is not None or head is self._heads.first():
                return append(head)
            try:
                return append(head)
            except NoSpace:
                if head.seg is not None:
                    raise
                self._heads.drop(head)
        with self._heads.take_first() as head:
            return append(head)

    # -- append / read ----------------------------------------------------

    def append_records(self, items: list[tuple[bytes, bytes | memoryview, int, int]]) -> list[Location]:
        """Append records (id, payload, raw length, codec); one write per segment touched."""
        return self._into_a_head(lambda head: self._append_records(head, items))

    def _append_records(self, head: Head, items: list[tuple[bytes, bytes | memoryview, int, int]]) -> list[Location]:
        locs: list[Location] = []
        i = 0
        while i < len(items):
            if head.seg is None or head.end + record_span(len(items[i][1])) > head.seg.size:
                self._rotate(head, record_span(len(items[i][1])))
            assert head.seg is not None
            start = head.end
            parts: list[bytes | memoryview] = []
            pos = start
            while i < len(items):
                cid, data, raw_len, codec = items[i]
                span = record_span(len(data))
                if pos + span > head.seg.size:
                    break
                parts.extend(record_parts(cid, data, raw_len, codec))
                locs.append(location(head.seg_id, pos, len(data), codec, raw_len))
                pos += span
                i += 1
            head.seg.write_parts(start, parts)
            self._appended(head, pos)
        return locs

    @contextlib.contextmanager
    def staging(self, size: int) -> Iterator[memoryview]:
        """A page-aligned buffer for `size` bytes of staged records and the zeros after them up
        to the next block boundary (`_native.stage_records(..., into=)`, then `append_staged`):
        pooled, so its pages are not faulted in again for every batch."""
        if round_up(size) <= self._staging.size:
            with self._staging.lend() as view:
                yield view
        else:  # a batch larger than any write batch: a buffer of its own, freed with its last view
            yield memoryview(mmap.mmap(-1, round_up(size)))

    def append_staged(self, staged: bytearray | memoryview, lengths: list[int]) -> list[Location]:
        """Append raw chunk records built already, back to back from the start of `staged`
        (`_native.stage_records`), of chunks `lengths` bytes long; one write per segment
        touched, no copy: a run of records that fits the head is written as one slice.

        Records of ALIGNED_MIN bytes or more in a `staging` buffer go to a direct segment
        with no copy at all: they start on the next block boundary (up to 4,032 bytes of
        zeros before them, a zero region like padding) and are written with the zeros after
        them to the block's end, straight from the buffer (DirectFileSegment.write_aligned);
        the next append starts after that block."""
        buf = memoryview(staged).cast("B")
        spans = [record_span(n) for n in lengths]
        if len(buf) < sum(spans):
            raise ValueError(f"staged records hold {len(buf)} bytes, not the records of {len(lengths)} chunks")
        return self._into_a_head(lambda head: self._append_staged(head, buf, lengths, spans))

    def _append_staged(self, head: Head, buf: memoryview, lengths: list[int], spans: list[int]) -> list[Location]:
        total = sum(spans)
        locs: list[Location] = []
        i, at = 0, 0
        while i < len(lengths):
            first = spans[i]
            aligned = at == 0 and total >= ALIGNED_MIN and head.seg is not None and head.seg.aligned_writes
            start = round_up(head.end) if aligned else head.end
            if head.seg is None or start + first > head.seg.size:
                self._rotate(head, first)
                start = head.end  # DATA_START: on a block boundary
            seg = head.seg
            assert seg is not None
            pos = start
            while i < len(lengths):
                span = spans[i]
                if pos + span > seg.size:
                    break
                locs.append(Location(head.seg_id, pos, lengths[i]))
                pos += span
                i += 1
            padded = round_up(pos)
            # (the zeros go after the batch's last record only: bytes after `pos` in the
            # buffer are records for the next segment when this one is full)
            if aligned and i == len(lengths) and padded <= seg.size and len(buf) >= padded - start:
                buf[pos - start:padded - start] = bytes(padded - pos)
                if seg.write_aligned(start, buf[:padded - start]):
                    at = pos - start
                    self._appended(head, padded)
                    continue
            seg.write_parts(start, [buf[at:at + pos - start]])
            at += pos - start
            self._appended(head, pos)
        return locs

    def read_chunk(self, loc: Location, chunk_id: bytes) -> memoryview:
        """Read one chunk, decoded and verified; damaged or missing bytes raise CorruptData."""
        payload = self.read_payload(loc, chunk_id)
        if not loc.encoded:
            return payload
        raw = self.decode(chunk_id, loc, payload)
        check_chunk(chunk_id, raw)
        return memoryview(raw)

    def read_payload(self, loc: Location, chunk_id: bytes) -> memoryview:
        """A record's payload as stored, its header checked (and a raw payload verified)."""
        dest = memoryview(bytearray(loc.stored_len))
        self.read_run(loc.seg_id, loc.offset, [(chunk_id, dest)], not loc.encoded)
        return dest

    def decode(self, chunk_id: bytes, loc: Location, payload: memoryview) -> bytes | memoryview:
        """The raw bytes of an encoded record's payload, in a new buffer (see decode_into)."""
        dest = memoryview(bytearray(loc.length))
        self.decode_into(chunk_id, loc, payload, dest)
        return dest

    def decode_into(self, chunk_id: bytes, loc: Location, payload: memoryview, dest: memoryview) -> None:
        """Decode an encoded record's payload into `dest` (not yet verified against
        `chunk_id`: the caller checks it); see decode_many."""
        self.decode_many([(chunk_id, loc, payload, dest)])

    def decode_many(self, items: list[Item]) -> None:
        """Decode encoded records' payloads, each into its dest (not yet verified: the caller
        checks each against its chunk id). A delta's bases are found with `locate_many` (or
        `locate`), read and decoded a level of the batch's chains at a time (chains.py), at
        most MAX_CHAIN records deep."""
        decode_batch(items, self.read_run, self._locate_many)

    def _locate_many(self, chunk_ids: list[bytes]) -> dict[bytes, Location]:
        if self.locate_many is not None:
            return self.locate_many(chunk_ids)
        if self.locate is None:
            raise CorruptData(f"chunk {chunk_ids[0].hex()[:16]}: no catalog to find it in (a delta base)")
        return {cid: loc for cid in chunk_ids if (loc := self.locate(cid)) is not None}

    def will_need(self, seg_id: int, offset: int, length: int) -> None:
        """A hint that these bytes of a segment will be read soon (the device may start reading)."""
        try:
            self.segment(seg_id).will_need(offset, length)
        except CorruptData:
            pass  # a missing segment: the read itself will say so

    def read_run(self, seg_id: int, offset: int, items: list[tuple[bytes, memoryview]], verify: bool = True) -> list[int]:
        """Read records lying back to back from `offset` of one segment, each chunk's payload
        straight into its `dest` (one preadv: headers and padding go to scratch buffers), and
        check them: a bad header, a record that is not the expected chunk or missing bytes
        raise CorruptData. With `verify`, each payload's BLAKE3 is checked too (`check_chunk`);
        a caller that passes False must check each payload before using it (against its
        BLAKE3, or against the payload CRC32 of its header: the returned list, in order)."""
        self._enter(seg_id)
        try:
            return self._read_run(seg_id, offset, items, verify)
        finally:
            self._leave(seg_id)

    def _read_run(self, seg_id: int, offset: int, items: list[tuple[bytes, memoryview]], verify: bool) -> list[int]:
        seg = self.segment(seg_id)
        heads = memoryview(bytearray(HEADER_SIZE * len(items)))
        pad = memoryview(bytearray(RECORD_ALIGN))
        buffers: list[memoryview] = []
        for k, (_cid, dest) in enumerate(items):
            buffers.append(heads[k * HEADER_SIZE:(k + 1) * HEADER_SIZE])
            buffers.append(dest)
            gap = record_span(len(dest)) - HEADER_SIZE - len(dest)
            if gap:
                buffers.append(pad[:gap])
        got = seg.read_into(offset, buffers)
        pos = offset
        crcs: list[int] = []
        for k, (cid, dest) in enumerate(items):
            where = f"chunk {cid.hex()[:16]} at segment {seg_id} offset {pos}"
            if got < pos - offset + HEADER_SIZE + len(dest):
                raise CorruptData(f"{where}: record truncated (the segment ends at {offset + got})")
            try:
                head = decode_record_header(heads[k * HEADER_SIZE:(k + 1) * HEADER_SIZE])
            except RecordError as e:
                raise CorruptData(f"{where}: {e}") from None
            if head.chunk_id != cid or head.stored_len != len(dest):
                raise CorruptData(f"{where}: record does not hold the expected chunk")
            if verify:
                check_chunk(cid, dest)
            crcs.append(head.payload_crc)
            pos += record_span(len(dest))
        return crcs

    # -- durability -------------------------------------------------------

    def sync(self) -> dict[int, int]:
        """Make every appended record durable; return {segment: durable end}."""
        with self._sync_lock:
            with self._lock:
                todo = [(sid, self._open[sid]) for sid in self._unsynced if sid in self._open]
                ends = {sid: self._ends.get(sid, 0) for sid, _ in todo}
                self._unsynced.clear()
            for _sid, seg in todo:
                seg.persist()
        return ends

    def head_positions(self) -> dict[int, int]:
        """{segment: where its records end} of every head segment (those taking appends). Exact
        while no append runs (gc and eviction ask under gc_lock alone; appends of chunks hold
        it shared)."""
        with self._lock:
            return {h.seg_id: self._ends.get(h.seg_id, h.end) for h in self._heads if h.seg is not None}

    def close(self) -> dict[int, int]:
        """Sync, cut the head's unused preallocation, close every segment."""
        ends = self.sync()
        with self._lock:
            for head in self._heads:
                if head.seg is not None:
                    head.seg.truncate(round_up(head.end))
                    head.seg = None
            for seg in self._open.values():
                seg.close()
            self._open.clear()
        if self.evicted is not None:
            self.evicted.close()
        return ends

    @staticmethod
    def recover_segment(path: Path, committed_end: int, device: str) -> int:
        """Cut a segment back to its committed end; returns bytes released."""
        end = max(committed_end, DATA_START)
        keep = round_up(end)
        size = os.path.getsize(path)
        if size <= keep:
            return 0
        seg = segment_class(device).open(path)
        try:
            seg.truncate(keep)
            if keep > end:  # no torn record header may survive in the last page
                seg.write(end, bytes(keep - end))
                seg.persist()
        finally:
            seg.close()
        return size - keep
