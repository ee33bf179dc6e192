"""One upload pass: a store's chunks and catalog into its bucket (docs/design.md, section 17).

1. Learn what the bucket holds: the doomed lists in `gc/` (their packs count as not in the
   bucket), then `index/` (the indexes this store has not seen; another store's packs count:
   a chunk already in the bucket is not uploaded again; packs whose index or object is gone
   are forgotten), and adopt a pack whose index a crash kept from being written.
2. Copy the catalog (SQLite backup: one consistent generation G).
3. Pin the chunks that copy's bodies use and the bucket lacks, so gc keeps them; records
   the compactor moves stay readable through a hold taken before.
4. Read them in log order, check each record (header, id, payload CRC), and cut packs of
   about `pack_size` bytes: PUT the pack, PUT its index, then note both in remote.db. A
   pack never gets the name of a doomed one (packs.PackBuilder.finish).
5. Look at `gc/` again (and at `index/` when a while has passed): what a remote gc marked
   or deleted meanwhile is uploaded again, until the copy needs nothing from doomed packs.
6. PUT the catalog copy, compressed, as `stores/UUID/catalog/G.db.zst`, note it, look
   again as in 5 (a gc that marked during the PUT); if the copy's chunks cannot be uploaded
   again, the catalog object is deleted and the pass fails. Then delete catalog objects
   older than the newest `KEEP_CATALOGS`.

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

from ..errors import CorruptData, RemoteError
from ..store.layout import CATALOG_FILE
from ..store.log import Location
from ..store.records import RecordError, check_record
from .doomed import MIN_GRACE, look_at_gc
from .packs import PackBuilder, PackIndex, decode_index, encode_index, entries_of_pack, is_pack_name, pack_name
from .s3 import Bucket, MissingObject
from .state import RemoteState

if TYPE_CHECKING:
    from ..store import Store

log = logging.getLogger("cowfs.remote")
PACK_SIZE = 64 << 20
KEEP_CATALOGS = 3
CATALOG_LEVEL = 3  # zstd level of catalog objects
MAX_RUN = 8 << 20  # bytes read from a segment at once
SETTLE_ROUNDS = 5  # looks at gc/ before (and after) the catalog's PUT that may each upload again


def pack_key(bucket: Bucket, name: str) -> str:
    return bucket.key("packs", name)


def index_key(bucket: Bucket, name: str) -> str:
    return bucket.key("index", name)


def indexed_packs(bucket: Bucket) -> set[str]:
    """The names of the packs whose index object is in the bucket (one listing of `index/`)."""
    prefix = index_key(bucket, "")
    return {obj.key[len(prefix):] for obj in bucket.list(prefix) if is_pack_name(obj.key[len(prefix):])}


def read_index(bucket: Bucket, name: str) -> PackIndex | None:
    """A pack's index from the bucket, checked against its name; None if it is gone (a sweep
    deleted it since the listing that named it)."""
    try:
        return decode_index(bucket.get(index_key(bucket, name)), expect_name=name)
    except MissingObject:
        return None


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
    forgotten: int = 0  # packs no longer in the bucket (a remote gc deleted them)
    reuploaded: int = 0  # chunks uploaded again because a remote gc marked their packs during the pass
    catalog_bytes: int = 0
    catalog_key: str = ""  # the catalog object of `generation`
    skipped: bool = False  # nothing new since the last pass
    seconds: float = 0.0
    evicted: dict[str, object] | None = None  # what the eviction after the pass did (evict.EvictReport), if limited

    def to_json(self) -> dict[str, object]:
        return dict(self.__dict__)


@dataclass
class Look:
    """What one look at the bucket learnt."""
    indexes_read: int = 0
    adopted: int = 0
    forgotten: int = 0
    doomed_lists: int = 0  # doomed lists new since the last look
    indexes_listed: bool = False

    @property
    def lost_holders(self) -> bool:
        """Did this look take packs away from what holds chunks (forgotten or newly doomed)?
        If not, a catalog copy that needed nothing more before it needs nothing more now."""
        return bool(self.forgotten or self.doomed_lists)


def refresh(bucket: Bucket, state: RemoteState, adopt: bool = True, indexes: bool = True) -> Look:
    """Note the doomed packs; read the indexes of packs this store does not know yet and
    forget the packs whose index (or, with `adopt`, object) is gone; with `adopt`, index
    orphan packs. `indexes=False` lists `index/` only if a doomed list noted before is gone.

    `gc/` is listed first: a sweep deletes a pack's index, then the pack, then the list that
    named it, so a pack this look sees neither doomed nor gone was not being deleted by a
    list it missed."""
    look = Look()
    swept, noted = look_at_gc(bucket, state)
    look.doomed_lists = len(noted)
    if not indexes and not swept:
        return look
    look.indexes_listed = True
    known = state.known_packs()
    indexed = indexed_packs(bucket)
    stored: set[str] | None = None
    if adopt:
        pprefix = bucket.key("packs", "")
        stored = {obj.key[len(pprefix):] for obj in bucket.list(pprefix) if is_pack_name(obj.key[len(pprefix):])}
    gone = (known - indexed) | (known - stored if stored is not None else set())
    look.forgotten = state.forget_packs(gone)
    known -= gone
    for name in sorted(indexed - known):
        if stored is not None and name not in stored:
            continue  # an index whose pack is gone: nothing to read from
        idx = read_index(bucket, name)
        if idx is None:
            continue
        state.add_pack(name, idx.size, idx.entries, mine=False)
        look.indexes_read += 1
    if stored is None:
        return look
    doomed = state.doomed_packs()
    for name in sorted(stored - indexed - known - doomed):  # a doomed orphan goes at the next sweep
        try:
            data = bucket.get(pack_key(bucket, name))
        except MissingObject:
            continue
        try:
            if pack_name(data) != name:
                raise CorruptData("its bytes do not hash to its name")
            entries = entries_of_pack(data)
        except CorruptData as e:  # damaged or foreign: left for fsck and gc, never indexed
            log.warning("pack %s without an index left alone: %s", name[:16], e)
            continue
        bucket.put(index_key(bucket, name), encode_index(name, len(data), entries))
        state.add_pack(name, len(data), entries, mine=False)
        look.adopted += 1
    return look


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
            check_record(rec, h, loc.stored_len)
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
    looked = time.monotonic()
    look = refresh(bucket, state)
    report.indexes_read, report.adopted, report.forgotten = look.indexes_read, look.adopted, look.forgotten
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
        up = _Uploader(store, bucket, state, pack_size, report)
        if not up.chunks([(h, locs[h]) for h, _ in need], progress, stop):
            return report
        looked = up.settle(copy, gen, looked, pinned)
        key = _put_catalog(store, bucket, state, copy, gen, report)
        try:
            up.settle(copy, gen, looked, pinned)
        except RemoteError:
            # a gc marked (and may delete) packs the catalog needs, which cannot be uploaded
            # again: the catalog goes, so no reader starts from it
            bucket.delete([key])
            state.forget_catalogs([gen])
            report.catalog_key = ""
            raise
        _drop_old_catalogs(bucket, state)
        return report
    finally:
        store.index.unpin(pinned)
        release()
        copy.unlink(missing_ok=True)
        report.seconds = time.monotonic() - t0


class _Uploader:
    """Chunks of the store into new packs, for one pass."""

    def __init__(self, store: "Store", bucket: Bucket, state: RemoteState, pack_size: int, report: PushReport) -> None:
        self.store, self.bucket, self.state = store, bucket, state
        self.pack_size, self.report = pack_size, report

    def chunks(self, locs: list[tuple[bytes, Location]], progress: Callable[[int, int], None] | None = None,
               stop: Callable[[], bool] | None = None) -> bool:
        """Upload these (pinned) chunks in log order; False if `stop` said so first."""
        todo = sorted(locs, key=lambda x: (x[1].seg_id, x[1].offset))
        total = sum(loc.span for _, loc in todo)
        done = 0
        builder = PackBuilder()
        for run in _runs(todo):
            if stop is not None and stop():
                return False
            for (h, loc), rec in zip(run, read_records(self.store, run)):
                builder.add(rec, h, loc.stored_len, loc.length, loc.codec)
                if builder.size >= self.pack_size:
                    self.pack(builder)
                    builder = PackBuilder()
            done += sum(loc.span for _, loc in run)
            if progress is not None:
                progress(done, total)
        if builder.entries:
            self.pack(builder)
        return True

    def pack(self, builder: PackBuilder) -> None:
        _upload_pack(self.bucket, self.state, builder, self.report)

    def settle(self, copy: Path, gen: int, looked: float, pinned: list[bytes]) -> float:
        """Look at the bucket again and upload what the copy needs that a remote gc marked or
        deleted since the last look, until it needs nothing more; returns when `index/` was
        last listed (monotonic). `index/` is listed again only after MIN_GRACE / 2: a doomed
        list made after the last look is swept MIN_GRACE after it at the soonest, and is
        still in `gc/` until then (docs/design.md section 17, "Remote gc")."""
        for _ in range(SETTLE_ROUNDS):
            t = time.monotonic()
            look = refresh(self.bucket, self.state, adopt=False, indexes=t - looked >= MIN_GRACE / 2)
            if look.indexes_listed:
                looked = t
            self.report.forgotten += look.forgotten
            if not look.lost_holders:  # new packs only add holders: the copy still lacks nothing
                return looked
            need = [h for h, _ in self.state.missing_chunks(copy)]
            if not need:
                return looked
            locs = self.store.index.pin(need)
            pinned += need
            lost = [h for h in need if h not in locs]
            if lost:
                raise RemoteError(f"{self.bucket.where}: {len(lost)} chunks generation {gen} uses were in packs a "
                                  "remote gc marked or deleted during this pass, and the store no longer holds them; "
                                  "the next pass uploads a newer generation")
            self.report.reuploaded += len(need)
            self.chunks([(h, locs[h]) for h in need])
        raise RemoteError(f"{self.bucket.where}: remote gc marked packs generation {gen} uses {SETTLE_ROUNDS} times "
                          "during this pass; the next pass tries again")


def _upload_pack(bucket: Bucket, state: RemoteState, builder: PackBuilder, report: PushReport) -> None:
    name, data, index = builder.finish(avoid=state.doomed_packs())
    key = pack_key(bucket, name)
    if not bucket.exists(key):  # another store (or a pass cut short) put these bytes already
        bucket.put(key, data)
    bucket.put(index_key(bucket, name), index)
    state.add_pack(name, len(data), builder.entries, mine=True)
    report.packs += 1
    report.chunks += len(builder.entries)
    report.bytes += len(data)


def _put_catalog(store: "Store", bucket: Bucket, state: RemoteState, copy: Path, gen: int,
                 report: PushReport) -> str:
    with open(copy, "rb") as f:
        data = zstandard.ZstdCompressor(level=CATALOG_LEVEL).compress(f.read())
    key = catalog_key(bucket, store.config.store_uuid, gen)
    bucket.put(key, data)
    state.add_catalog(gen, key, len(data))
    report.catalog_bytes, report.catalog_key = len(data), key
    return key


def _drop_old_catalogs(bucket: Bucket, state: RemoteState) -> None:
    old = state.catalogs()[:-KEEP_CATALOGS]
    if old:
        bucket.delete([k for _, k in old])
        state.forget_catalogs([g for g, _ in old])


def decode_catalog(data: bytes) -> bytes:
    return zstandard.ZstdDecompressor().decompress(data, max_output_size=1 << 36)


__all__ = ["PushReport", "Look", "push", "refresh", "copy_catalog", "decode_catalog", "pack_key", "index_key",
           "catalog_key", "decode_index"]
