"""One upload pass: a store's chunks and catalog into its bucket (docs/design.md, section 17).

1. Learn what the bucket holds: list `index/`, read the indexes this store has not seen
   (another store's packs count: a chunk already in the bucket is not uploaded again), and
   adopt a pack whose index a crash kept from being written.
2. Copy the catalog (SQLite backup: one consistent generation G).
3. Pin the chunks that copy's bodies use and the bucket lacks, so gc keeps them; records
   the compactor moves stay readable through a hold taken before.
4. Read them in log order, check each record (header, id, payload CRC), and cut packs of
   about `pack_size` bytes: PUT the pack, PUT its index, then note both in remote.db.
5. PUT the catalog copy, compressed, as `stores/UUID/catalog/G.db.zst`, note it, and delete
   catalog objects older than the newest `KEEP_CATALOGS`.

Every object is immutable and named by its content or generation, so a pass cut short
anywhere (kill -9, network down) leaves objects the next pass reuses: a pack without its
index is adopted in step 1, and a catalog is never named before every chunk it uses is in.
"""
from __future__ import annotations

import logging
import os
import sqlite3
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import zstandard

from ..errors import CorruptData
from ..store.layout import CATALOG_FILE
from ..store.log import Location
from ..store.records import HEADER_SIZE, RecordError, check_payload, decode_record_header
from .packs import PackBuilder, decode_index, encode_index, entries_of_pack, is_pack_name, pack_name
from .s3 import Bucket
from .state import RemoteState

if TYPE_CHECKING:
    from ..store import Store

log = logging.getLogger("cowfs.remote")
PACK_SIZE = 64 << 20
KEEP_CATALOGS = 3
CATALOG_LEVEL = 3  # zstd level of catalog objects
MAX_RUN = 8 << 20  # bytes read from a segment at once


def pack_key(bucket: Bucket, name: str) -> str:
    return bucket.key("packs", name)


def index_key(bucket: Bucket, name: str) -> str:
    return bucket.key("index", name)


def catalog_key(bucket: Bucket, store_uuid: str, gen: int) -> str:
    return bucket.key("stores", store_uuid, "catalog", f"{gen:016d}.db.zst")


@dataclass
class PushReport:
    generation: int = 0  # the catalog generation now in the bucket
    packs: int = 0  # packs this pass uploaded
    chunks: int = 0
    bytes: int = 0  # pack bytes uploaded
    adopted: int = 0  # packs found without an index and indexed
    indexes_read: int = 0  # other stores' (or earlier passes') indexes learnt
    catalog_bytes: int = 0
    catalog_key: str = ""  # the catalog object of `generation`
    skipped: bool = False  # nothing new since the last pass
    seconds: float = 0.0
    evicted: dict[str, object] | None = None  # what the eviction after the pass did (evict.EvictReport), if limited

    def to_json(self) -> dict[str, object]:
        return dict(self.__dict__)


def refresh(bucket: Bucket, state: RemoteState) -> tuple[int, int]:
    """Read the indexes of packs this store does not know yet; adopt orphan packs.
    Returns (indexes read, packs adopted)."""
    known = state.known_packs()
    indexed: set[str] = set()
    read = 0
    prefix = bucket.key("index", "")
    for obj in bucket.list(prefix):
        name = obj.key[len(prefix):]
        if not is_pack_name(name):
            continue
        indexed.add(name)
        if name in known:
            continue
        idx = decode_index(bucket.get(obj.key), expect_name=name)
        state.add_pack(name, idx.size, idx.entries, mine=False)
        read += 1
    adopted = 0
    prefix = bucket.key("packs", "")
    for obj in bucket.list(prefix):
        name = obj.key[len(prefix):]
        if not is_pack_name(name) or name in indexed or name in known:
            continue
        data = bucket.get(obj.key)
        try:
            if pack_name(data) != name:
                raise CorruptData("its bytes do not hash to its name")
            entries = entries_of_pack(data)
        except CorruptData as e:  # damaged or foreign: left for fsck, never indexed
            log.warning("pack %s without an index left alone: %s", name[:16], e)
            continue
        bucket.put(index_key(bucket, name), encode_index(name, len(data), entries))
        state.add_pack(name, len(data), entries, mine=False)
        adopted += 1
    return read, adopted


def copy_catalog(store: "Store", dest: Path) -> int:
    """A consistent copy of the catalog at `dest`; returns its generation."""
    src = sqlite3.connect(f"file:{store.root / CATALOG_FILE}?mode=ro", uri=True)
    try:
        dst = sqlite3.connect(dest)
        try:
            src.backup(dst)
            (gen,) = dst.execute("SELECT value FROM meta WHERE key='generation'").fetchone()
        finally:
            dst.close()
    finally:
        src.close()
    return int(gen)


def _runs(locs: list[tuple[bytes, Location]]) -> list[list[tuple[bytes, Location]]]:
    """Records lying back to back in one segment, grouped to be read at once."""
    runs: list[list[tuple[bytes, Location]]] = []
    for h, loc in locs:
        if runs:
            last = runs[-1][-1][1]
            size = runs[-1][-1][1].offset + last.span - runs[-1][0][1].offset
            if last.seg_id == loc.seg_id and last.offset + last.span == loc.offset and size < MAX_RUN:
                runs[-1].append((h, loc))
                continue
        runs.append([(h, loc)])
    return runs


def read_records(store: "Store", run: list[tuple[bytes, Location]]) -> list[memoryview]:
    """The whole records of one run, each checked: header, chunk id, payload CRC."""
    first = run[0][1]
    total = run[-1][1].offset + run[-1][1].span - first.offset
    buf = memoryview(bytearray(total))
    got = store.log.segment(first.seg_id).read_into(first.offset, [buf])
    out: list[memoryview] = []
    for h, loc in run:
        rel = loc.offset - first.offset
        where = f"chunk {h.hex()[:16]} at segment {loc.seg_id} offset {loc.offset}"
        if got < rel + loc.span:
            raise CorruptData(f"{where}: record truncated")
        rec = buf[rel:rel + loc.span]
        try:
            head = decode_record_header(rec[:HEADER_SIZE])
            if head.chunk_id != h or head.stored_len != loc.stored_len:
                raise RecordError("record does not hold the expected chunk")
            check_payload(head, rec[HEADER_SIZE:HEADER_SIZE + head.stored_len])
        except RecordError as e:
            raise CorruptData(f"{where}: {e}") from None
        out.append(rec)
    return out


def push(store: "Store", bucket: Bucket, state: RemoteState, pack_size: int | None = None,
         progress: Callable[[int, int], None] | None = None, stop: Callable[[], bool] | None = None) -> PushReport:
    """Upload what the bucket lacks of the store's current generation; see the module text."""
    t0 = time.monotonic()
    pack_size = pack_size or PACK_SIZE
    report = PushReport()
    report.indexes_read, report.adopted = refresh(bucket, state)
    tmpdir = store.root / "tmp"
    tmpdir.mkdir(exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix="remote-catalog-", suffix=".db", dir=tmpdir)
    os.close(fd)
    copy = Path(tmp_name)
    release = store.holds.hold(None)  # records the compactor retires from now on stay readable
    pinned: list[bytes] = []
    try:
        gen = copy_catalog(store, copy)
        report.generation = gen
        need = state.missing_chunks(copy)
        if gen <= state.last_catalog() and not need:
            report.skipped = True
            report.generation, report.catalog_key = state.catalogs()[-1]
            return report
        while True:
            locs = store.index.pin([h for h, _ in need])
            pinned += [h for h, _ in need]
            if all(h in locs for h, _ in need):
                break
            # gc deleted a chunk the copy uses after the copy was made: copy again (the new
            # generation no longer uses it)
            copy.unlink()
            gen = copy_catalog(store, copy)
            report.generation = gen
            need = state.missing_chunks(copy)
        todo = sorted(((h, locs[h]) for h, _ in need), key=lambda x: (x[1].seg_id, x[1].offset))
        total = sum(loc.span for _, loc in todo)
        done = 0
        builder = PackBuilder()
        for run in _runs(todo):
            if stop is not None and stop():
                return report
            for (h, loc), rec in zip(run, read_records(store, run)):
                builder.add(rec, h, loc.stored_len, loc.length, loc.codec)
                if builder.size >= pack_size:
                    _upload_pack(bucket, state, builder, report)
                    builder = PackBuilder()
            done += sum(loc.span for _, loc in run)
            if progress is not None:
                progress(done, total)
        if builder.entries:
            _upload_pack(bucket, state, builder, report)
        _upload_catalog(store, bucket, state, copy, gen, report)
        return report
    finally:
        store.index.unpin(pinned)
        release()
        copy.unlink(missing_ok=True)
        report.seconds = time.monotonic() - t0


def _upload_pack(bucket: Bucket, state: RemoteState, builder: PackBuilder, report: PushReport) -> None:
    name, data, index = builder.finish()
    key = pack_key(bucket, name)
    if not bucket.exists(key):
        bucket.put(key, data)
    bucket.put(index_key(bucket, name), index)
    state.add_pack(name, len(data), builder.entries, mine=True)
    report.packs += 1
    report.chunks += len(builder.entries)
    report.bytes += len(data)


def _upload_catalog(store: "Store", bucket: Bucket, state: RemoteState, copy: Path, gen: int,
                    report: PushReport) -> None:
    with open(copy, "rb") as f:
        data = zstandard.ZstdCompressor(level=CATALOG_LEVEL).compress(f.read())
    key = catalog_key(bucket, store.config.store_uuid, gen)
    bucket.put(key, data)
    state.add_catalog(gen, key, len(data))
    report.catalog_bytes, report.catalog_key = len(data), key
    old = state.catalogs()[:-KEEP_CATALOGS]
    if old:
        bucket.delete([k for _, k in old])
        state.forget_catalogs([g for g, _ in old])


def decode_catalog(data: bytes) -> bytes:
    return zstandard.ZstdDecompressor().decompress(data, max_output_size=1 << 36)


__all__ = ["PushReport", "push", "refresh", "copy_catalog", "decode_catalog", "pack_key", "index_key",
           "catalog_key", "decode_index"]
