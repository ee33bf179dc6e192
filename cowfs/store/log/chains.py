"""Decoding encoded records a batch at a time: a read window's records at once.

A delta record (codecs.py) decodes against its base chunk's raw bytes, and the base may be
a delta itself, up to MAX_CHAIN records per read: a piece of a checkpoint three deltas older
than the newest decodes three records after reading four. Taken record by record, each base
cost a catalog query and a read of its own, from Python, for every level of every piece.
Here a batch is taken a level of its chains at a time:

1. the ids of the level's bases, from the payloads' first bytes (a base two records share is
   taken once);
2. their locations, in one catalog query (`locate_many`);
3. their payloads, one read per run of records lying back to back in a segment (the
   compactor writes a checkpoint's pieces in order, so the bases of a window's pieces lie
   together too), each checked against its header's CRC32. Not against its BLAKE3: the
   caller checks what is decoded from it against the chunk's id, and a damaged base cannot
   decode to bytes with that hash;
4. the encoded ones decoded the same way (the next level);
5. then the batch's own records decoded, each into its `dest`.

Buffers for payloads and decoded bases are left uninitialised (buffers.py): each is
overwritten whole.
"""
from __future__ import annotations

from typing import Callable, Iterable

from ... import _native
from ...errors import CorruptData
from .buffers import uninitialised
from .codecs import base_of, decode_into
from .layout import MAX_CHAIN
from .records import MAX_RUN, Location

# (chunk id, where its record is, its payload as stored, where its raw bytes go)
Item = tuple[bytes, Location, memoryview, memoryview]
ReadRun = Callable[[int, int, list[tuple[bytes, memoryview]], bool], list[int]]  # Log.read_run
LocateMany = Callable[[list[bytes]], dict[bytes, Location]]


def decode_batch(items: list[Item], read_run: ReadRun, locate_many: LocateMany, depth: int = 1) -> None:
    """Decode each item's payload into its dest (not checked against its chunk id: the caller
    does). `depth`: records of the chains above these (a chain longer than MAX_CHAIN records
    is damage)."""
    bases: dict[bytes, memoryview] = {}
    wanted: dict[bytes, bytes] = {}  # base id -> the first chunk that needs it (for errors)
    for chunk, loc, payload, _dest in items:
        base_id = base_of(loc.codec, payload)
        if base_id is not None:
            wanted.setdefault(base_id, chunk)
    if wanted:
        if depth >= MAX_CHAIN:
            raise CorruptData(f"chunk {next(iter(wanted.values())).hex()[:16]}: delta chain longer than {MAX_CHAIN} records")
        found = locate_many(list(wanted))
        for base_id, chunk in wanted.items():
            if base_id not in found:
                raise CorruptData(f"chunk {chunk.hex()[:16]}: its delta base {base_id.hex()[:16]} is missing")
        payloads = read_payloads([(base_id, found[base_id]) for base_id in wanted], read_run)
        deeper: list[Item] = []
        for base_id, payload in payloads.items():
            loc = found[base_id]
            if loc.encoded:
                out = uninitialised(loc.length)
                deeper.append((base_id, loc, payload, out))
                bases[base_id] = out
            else:
                bases[base_id] = payload
        if deeper:
            decode_batch(deeper, read_run, locate_many, depth + 1)
    for _chunk, loc, payload, dest in items:
        decode_into(loc.codec, payload, dest, bases.__getitem__)


def read_payloads(records: Iterable[tuple[bytes, Location]], read_run: ReadRun) -> dict[bytes, memoryview]:
    """The payloads of these records as stored, read a run of back-to-back records at a time,
    each checked against its header (read_run) and its payload CRC32."""
    out: dict[bytes, memoryview] = {}
    for seg_id, offset, run in runs_of(records):
        bufs = [uninitialised(loc.stored_len) for _cid, loc in run]
        crcs = read_run(seg_id, offset, [(cid, buf) for (cid, _loc), buf in zip(run, bufs)], False)
        for (cid, loc), buf, crc in zip(run, bufs, crcs):
            if _native.crc32(buf) != crc:
                raise CorruptData(f"chunk {cid.hex()[:16]}: payload checksum mismatch "
                                  f"(segment {loc.seg_id}, offset {loc.offset})")
            out[cid] = buf
    return out


def runs_of(records: Iterable[tuple[bytes, Location]]) -> list[tuple[int, int, list[tuple[bytes, Location]]]]:
    """(segment, offset, records) for each run of records lying back to back in one segment, in
    the segments' order, at most MAX_RUN records each."""
    runs: list[tuple[int, int, list[tuple[bytes, Location]]]] = []
    nxt = (-1, -1)
    for cid, loc in sorted(records, key=lambda r: (r[1].seg_id, r[1].offset)):
        if runs and (loc.seg_id, loc.offset) == nxt and len(runs[-1][2]) < MAX_RUN:
            runs[-1][2].append((cid, loc))
        else:
            runs.append((loc.seg_id, loc.offset, [(cid, loc)]))
        nxt = (loc.seg_id, loc.offset + loc.span)
    return runs
