"""One upload pass: a store's chunks and catalog into its bucket (docs/design.md, section 17).

1. Learn what the bucket holds: the doomed lists in `gc/` (their packs count as not in the
   bucket), then `index/` (the indexes this store has not seen; another store's packs count:
   a chunk already in the bucket is not uploaded again; packs whose index or object is gone
   are forgotten), and adopt a pack whose index a crash kept from being written.
2. Read the catalog once (`deltas.take`, one read transaction: one generation G): the rows
   changed since the last catalog object noted (a delta), and, when one is due (none yet, a
   pack forgotten since, the deltas since the last add up to half its size or MAX_DELTAS, or
   `whole`), a whole copy.
3. Pin the chunks the catalog objects need and the bucket lacks (a delta: those its extents
   use; a whole copy: those every body uses), so gc keeps them; records the compactor moves
   stay readable through a hold taken before.
4. Read them in log order, check each record (header, id, payload CRC), and cut packs of
   about `pack_size` bytes: PUT the pack, PUT its index, then note both in remote.db. A
   pack never gets the name of a doomed one (packs.PackBuilder.finish).
5. Look at `gc/` again (and at `index/` when a while has passed): what a remote gc marked
   or deleted meanwhile is uploaded again, until the objects need nothing from doomed packs.
6. PUT the delta `stores/UUID/catalog/G.from-F.delta.zst`, compressed, note it and look
   again as in 5 (a gc that marked during the PUT); then consumers may be told of G
   (`on_catalog`, given the delta's bytes and the indexes of the pass's packs, which a
   notice may carry: notices.Inline). Then the whole catalog `stores/UUID/catalog/G.db.zst` if one was read,
   the same way. If what they need cannot be uploaded again, the objects are deleted and
   the pass fails. After a whole catalog, delete the store's catalog objects older than
   the whole one before it (`whole`: older than this one). Trim the change log.

Every object is immutable and named by its content or generation, so a pass cut short
anywhere (kill -9, network down) leaves objects the next pass reuses: a pack without its
index is adopted in step 1, and a catalog object is never named before every chunk it uses
is in.
"""
from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import zstandard

from ..errors import CorruptData, RemoteError
from ..store.log.log import Location
from ..store.log.records import RecordError, check_record
from . import deltas
from .bucket_look import Looks, catalog_key, delta_key, index_key, pack_key, refresh
from .catalogs import retained_catalogs
from .notices import INLINE_MAX, Inline
from .packs import PackArena, PackBuilder
from .s3 import PART_SIZE, Bucket
from .state import RemoteState

if TYPE_CHECKING:
    from ..store import Store

PACK_SIZE = 64 << 20
WHOLE_EVERY = 0.5  # a whole catalog once the deltas since the last add up to this much of its size
WHOLE_MIN_BYTES = 1 << 20  # ... but not before they add up to this (an empty delta is 2.5 KB compressed)
MAX_DELTAS = 64  # ... or this many (a consumer starting from a whole catalog applies at most these)
CATALOG_LEVEL = 3  # zstd level of catalog objects
MAX_RUN = 8 << 20  # bytes read from a segment at once
HEAD_ABOVE = PART_SIZE  # a pack larger than this is looked for (HEAD) before its PUT; a smaller one is PUT at once
SETTLE_ROUNDS = 5  # looks at gc/ before (and after) the catalog's PUT that may each upload again


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
    catalog_bytes: int = 0  # compressed bytes of the catalog objects this pass uploaded
    catalog_key: str = ""  # the catalog object of `generation` consumers are told of (the delta if any)
    delta_key: str = ""  # the delta this pass uploaded, if any
    delta_rows: int = 0  # the keys it holds
    whole_key: str = ""  # the whole catalog this pass uploaded, if any
    told: bool = False  # `on_catalog` was called with catalog_key (consumers told before the whole catalog)
    skipped: bool = False  # nothing new since the last pass
    seconds: float = 0.0
    evicted: dict[str, object] | None = None  # what the eviction after the pass did (evict.EvictReport), if limited

    def to_json(self) -> dict[str, object]:
        return dict(self.__dict__)


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


def read_records(store: "Store", run: list[tuple[bytes, Location]],
                 into: list[memoryview] | None = None) -> list[memoryview | bytes]:
    """The whole records of one run, each checked: header, chunk id, payload CRC. `into`:
    the buffers to read them into, in order (a pack's layout), else one new buffer; a record
    across buffers is checked and returned as a copy."""
    first = run[0][1]
    total = run[-1][1].offset + run[-1][1].span - first.offset
    bufs = into if into is not None else [memoryview(bytearray(total))]
    got = store.log.segment(first.seg_id).read_into(first.offset, list(bufs))
    starts = [0]
    for b in bufs:
        starts.append(starts[-1] + len(b))
    out: list[memoryview | bytes] = []
    k = 0
    for h, loc in run:
        rel = loc.offset - first.offset
        where = f"chunk {h.hex()[:16]} at segment {loc.seg_id} offset {loc.offset}"
        if got < rel + loc.span:
            raise CorruptData(f"{where}: record truncated")
        while starts[k + 1] <= rel:
            k += 1
        within = rel - starts[k]
        rec: memoryview | bytes
        if within + loc.span <= len(bufs[k]):
            rec = bufs[k][within:within + loc.span]
        else:  # across buffers
            pieces, need, j = [], loc.span, k
            while need > 0:
                piece = bufs[j][within:within + need]
                pieces.append(piece)
                need -= len(piece)
                j, within = j + 1, 0
            rec = b"".join(pieces)
        try:
            check_record(rec, h, loc.stored_len)
        except RecordError as e:
            raise CorruptData(f"{where}: {e}") from None
        out.append(rec)
    return out


def push(store: "Store", bucket: Bucket, state: RemoteState, pack_size: int | None = None,
         progress: Callable[[int, int], None] | None = None, stop: Callable[[], bool] | None = None,
         whole: bool = False, on_catalog: Callable[[int, str, Inline], None] | None = None,
         looks: Looks | None = None) -> PushReport:
    """Upload what the bucket lacks of the store's current generation; see the module text.
    `whole`: a whole catalog as well as the delta, and the store's older catalog objects
    deleted (what remote gc's pass does, so that what the store dropped stops being live).
    `on_catalog(generation, key, inline)`: called once the generation's delta is in and
    checked (or its whole catalog, for the first), so consumers can be told (`report.told`);
    `inline` holds that object's bytes and the indexes of the packs the pass PUT (none if
    they came to more than INLINE_MAX). When a
    whole catalog is due by the size of the deltas since the last (not asked for, no pack
    forgotten), a pass that tells runs as two: the delta alone, told at once, then the whole
    catalog (and a delta of what changed meanwhile), so the notice does not wait for a copy
    and a check of the whole catalog, which grow with the store. `looks`: when the tier last
    looked at the bucket, updated by the pass (None: a new one, so every look is made)."""
    looks = looks if looks is not None else Looks()
    try:
        return _push(store, bucket, state, pack_size, progress, stop, whole, on_catalog, looks)
    except BaseException:
        looks.failed = True  # it may have left a pack without its index: the next pass lists packs/
        raise


def _push(store: "Store", bucket: Bucket, state: RemoteState, pack_size: int | None,
          progress: Callable[[int, int], None] | None, stop: Callable[[], bool] | None, whole: bool,
          on_catalog: Callable[[int, str, Inline], None] | None, looks: Looks) -> PushReport:
    if on_catalog is not None and not whole and state.since() is not None and state.full_check_due() is None \
            and _whole_due(state):
        first = _pass(store, bucket, state, pack_size, progress, stop, False, on_catalog, looks, whole_due=False)
        if stop is not None and stop():
            return first
        return _merged(first, _pass(store, bucket, state, pack_size, progress, stop, False, on_catalog, looks))
    return _pass(store, bucket, state, pack_size, progress, stop, whole, on_catalog, looks)


def _merged(first: PushReport, second: PushReport) -> PushReport:
    """One report of a pass run as two (`push`)."""
    out = replace(second, told=first.told or second.told, seconds=first.seconds + second.seconds)
    for name in ("packs", "chunks", "bytes", "adopted", "indexes_read", "forgotten", "reuploaded", "catalog_bytes"):
        setattr(out, name, getattr(first, name) + getattr(second, name))
    if not second.delta_key:
        out.delta_key, out.delta_rows, out.catalog_key = first.delta_key, first.delta_rows, first.catalog_key
    out.skipped = first.skipped and second.skipped
    return out


def _pass(store: "Store", bucket: Bucket, state: RemoteState, pack_size: int | None,
          progress: Callable[[int, int], None] | None, stop: Callable[[], bool] | None, whole: bool,
          on_catalog: Callable[[int, str, Inline], None] | None, looks: Looks,
          whole_due: bool | None = None) -> PushReport:
    """One pass of `push`; `whole_due` False: no whole catalog unless asked for or a pack was
    forgotten (None: by `_whole_due`)."""
    t0 = time.monotonic()
    pack_size = pack_size or PACK_SIZE
    report = PushReport()
    look = refresh(bucket, state, looks=looks)
    report.indexes_read, report.adopted, report.forgotten = look.indexes_read, look.adopted, look.forgotten
    deltas.install(store)
    tmpdir = store.root / "tmp"
    tmpdir.mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="remote-catalog-", dir=tmpdir))
    release = store.holds.hold(None)  # records the compactor retires from now on stay readable
    pinned: list[bytes] = []
    try:
        since = state.since()
        asked, check = whole, state.full_check_due()
        whole = whole or check is not None or (_whole_due(state) if whole_due is None else whole_due)
        while True:
            plan = _Plan(work, since, whole)
            plan.taken = deltas.take(store, since, plan.delta, plan.base)
            if plan.taken.delta_rows < 0 and plan.base is None:  # no delta from what the bucket has: whole
                since, whole = None, True
                continue
            gen = report.generation = plan.taken.generation
            need = plan.missing(state)
            if gen <= state.last_catalog() and not need and (
                    not whole or (check is None and state.newest_whole() == gen)):
                report.skipped = True  # nothing new (a whole catalog of this generation is in already)
                report.generation, report.catalog_key = state.catalogs()[-1]
                if asked:
                    _drop_old_catalogs(bucket, state, store.config.store_uuid, gen, keep_previous=False)
                return report
            locs = store.index.pin([h for h, _ in need])
            pinned += [h for h, _ in need]
            if all(h in locs for h, _ in need):
                break
            # gc deleted a chunk the copy uses after it was read: read again (the newer
            # generation no longer uses it)
        up = _Uploader(store, bucket, state, pack_size, report, looks)
        if not up.chunks([(h, locs[h]) for h, _ in need], progress, stop):
            return report
        up.settle(plan, pinned, before_put=True)
        keys: list[str] = []
        try:
            for path, key, from_gen in _catalog_objects(bucket, store.config.store_uuid, plan):
                data = _put_catalog(bucket, state, plan, report, path, key, from_gen)
                keys.append(key)
                up.settle(plan, pinned)
                if on_catalog is not None and len(keys) == 1 and (from_gen is not None or plan.since is None):
                    # a delta, or the first catalog: not a whole one consumers have the delta of
                    on_catalog(gen, key, Inline(data, up.indexes if up.indexes is not None else {}))
                    report.told = True
        except RemoteError:
            # a gc marked (and may delete) packs the catalog needs, which cannot be uploaded
            # again: the catalog goes, so no reader starts from it
            bucket.delete(keys)
            state.forget_catalogs(keys)
            report.catalog_key = ""
            raise
        if plan.base is not None:
            state.full_check_done(check)
            _drop_old_catalogs(bucket, state, store.config.store_uuid, gen, keep_previous=not asked)
        if plan.taken.mark is not None:
            deltas.trim(store, plan.taken.mark)
        return report
    finally:
        store.index.unpin(pinned)
        release()
        shutil.rmtree(work, ignore_errors=True)
        report.seconds = time.monotonic() - t0


def _whole_due(state: RemoteState) -> bool:
    """A whole catalog is due (besides when a pack was forgotten since the last, so that what
    the catalog needs is checked whole): none yet, or the deltas since the last add up to more than
    WHOLE_EVERY of its size (and WHOLE_MIN_BYTES) or number MAX_DELTAS."""
    chain = state.chain()
    if chain is None:
        return True
    base, size, n = chain
    return size > max(WHOLE_EVERY * base, WHOLE_MIN_BYTES) or n >= MAX_DELTAS


class _Plan:
    """What one pass uploads as catalog objects: a delta since the last one noted and, when
    `whole`, a whole catalog of the same generation, both read by one `deltas.take`."""

    def __init__(self, work: Path, since: tuple[int, deltas.Mark] | None, whole: bool) -> None:
        for f in work.iterdir():
            f.unlink()
        self.since = since
        self.delta: Path | None = work / "delta.db" if since is not None else None
        self.base: Path | None = work / "catalog.db" if whole else None
        self.taken = deltas.Taken(0, None)

    @property
    def has_delta(self) -> bool:
        return self.since is not None and self.taken.delta_rows >= 0 and self.taken.generation > self.since[0]

    def missing(self, state: RemoteState) -> list[tuple[bytes, int]]:
        """(hash, stored_len) of what the catalog objects need that no pack no doomed list
        names holds, in log order: for a whole catalog, what every body uses (a query over
        every chunk row); for a delta alone, what its new extents use."""
        if self.base is not None:
            return state.missing_chunks(self.base)
        needs = self.taken.needs or []
        have = state.has([h for h, _ in needs])
        return [(h, n) for h, n in needs if h not in have]


class _Uploader:
    """Chunks of the store into new packs, for one pass."""

    def __init__(self, store: "Store", bucket: Bucket, state: RemoteState, pack_size: int, report: PushReport,
                 looks: Looks) -> None:
        self.store, self.bucket, self.state = store, bucket, state
        self.pack_size, self.report, self.looks = pack_size, report, looks
        self.indexes: dict[str, bytes] | None = {}  # the packs' index objects; None past INLINE_MAX

    def chunks(self, locs: list[tuple[bytes, Location]], progress: Callable[[int, int], None] | None = None,
               stop: Callable[[], bool] | None = None) -> bool:
        """Upload these (pinned) chunks in log order; False if `stop` said so first."""
        todo = sorted(locs, key=lambda x: (x[1].seg_id, x[1].offset))
        total = sum(loc.span for _, loc in todo)
        done = 0
        if not todo:
            return True
        # records are read into their place in the pack (one arena, reused pack after pack);
        # a run is cut where a pack fills up, so every read lands in one pack
        arena = PackArena(min(total, self.pack_size + MAX_RUN + max(loc.span for _, loc in todo)), PART_SIZE)
        builder = PackBuilder(arena)
        for run in _runs(todo):
            while run:
                if stop is not None and stop():
                    return False
                n, end = 0, builder.size
                while n < len(run) and end < self.pack_size:
                    end += run[n][1].span
                    n += 1
                part, run = run[:n], run[n:]
                done += end - builder.size
                recs = read_records(self.store, part, builder.reserve(end - builder.size))
                for (h, loc), rec in zip(part, recs):
                    builder.add(rec, h, loc.stored_len, loc.length, loc.codec)
                if builder.size >= self.pack_size:
                    self.pack(builder)
                    builder = PackBuilder(arena)
            if progress is not None:
                progress(done, total)
        if builder.entries:
            self.pack(builder)
        return True

    def pack(self, builder: PackBuilder) -> None:
        name, index = _upload_pack(self.bucket, self.state, builder, self.report)
        if self.indexes is not None:
            self.indexes[name] = index
            if sum(len(v) for v in self.indexes.values()) > INLINE_MAX:
                self.indexes = None

    def settle(self, plan: _Plan, pinned: list[bytes], before_put: bool = False) -> None:
        """Look at the bucket again and upload what the copy needs that a remote gc marked or
        deleted since the last look, until it needs nothing more. `index/` is listed again
        only after INDEX_EVERY (MIN_GRACE / 2): a doomed list made after the last look is
        swept MIN_GRACE after it at the soonest, and is still in `gc/` until then (docs/design.md
        section 17, "Remote gc"). `before_put`: the look before a catalog's PUT, left out when
        a look at `gc/` began less than FRESH ago ("Fewer looks per pass")."""
        if before_put and self.looks.gc_fresh(self.looks.clock()):
            return
        for _ in range(SETTLE_ROUNDS):
            look = refresh(self.bucket, self.state, adopt=False, looks=self.looks)
            self.report.forgotten += look.forgotten
            if not look.lost_holders:  # new packs only add holders: the copy still lacks nothing
                return
            need = [h for h, _ in plan.missing(self.state)]
            if not need:
                return
            locs = self.store.index.pin(need)
            pinned += need
            lost = [h for h in need if h not in locs]
            if lost:
                raise RemoteError(f"{self.bucket.where}: {len(lost)} chunks generation {plan.taken.generation} uses were in packs a "
                                  "remote gc marked or deleted during this pass, and the store no longer holds them; "
                                  "the next pass uploads a newer generation")
            self.report.reuploaded += len(need)
            self.chunks([(h, locs[h]) for h in need])
        raise RemoteError(f"{self.bucket.where}: remote gc marked packs generation {plan.taken.generation} uses {SETTLE_ROUNDS} times "
                          "during this pass; the next pass tries again")


def _upload_pack(bucket: Bucket, state: RemoteState, builder: PackBuilder, report: PushReport) -> tuple[str, bytes]:
    """PUT the pack and its index, and note them; returns the pack's name and its index."""
    name, data, index = builder.finish(avoid=state.doomed_packs())
    key = pack_key(bucket, name)
    # A pack another store (or a pass cut short) put already is not sent again when it is
    # large. A small one is PUT without that HEAD: the same bytes under the same name again,
    # which only renews its LastModified, and a sweep keeps a pack PUT again since its mark.
    if builder.size <= HEAD_ABOVE or not bucket.exists(key):
        bucket.put(key, data)
    bucket.put(index_key(bucket, name), index)
    state.add_pack(name, builder.size, builder.entries, mine=True)
    report.packs += 1
    report.chunks += len(builder.entries)
    report.bytes += builder.size
    return name, index


def _catalog_objects(bucket: Bucket, uuid: str, plan: _Plan) -> list[tuple[Path, str, int | None]]:
    """(file, key, from generation or None) of the catalog objects of the pass: the delta
    first (the key sent in notices: consumers holding its start apply it), then the whole."""
    gen = plan.taken.generation
    out: list[tuple[Path, str, int | None]] = []
    if plan.has_delta:
        assert plan.delta is not None and plan.since is not None
        out.append((plan.delta, delta_key(bucket, uuid, gen, plan.since[0]), plan.since[0]))
    if plan.base is not None:
        out.append((plan.base, catalog_key(bucket, uuid, gen), None))
    return out


def _put_catalog(bucket: Bucket, state: RemoteState, plan: _Plan, report: PushReport, path: Path, key: str,
                 from_gen: int | None) -> bytes:
    """PUT one catalog object, compressed, and note it; returns the bytes PUT."""
    with open(path, "rb") as f:
        data = zstandard.ZstdCompressor(level=CATALOG_LEVEL, write_content_size=True).compress(f.read())
    bucket.put(key, data)
    state.add_catalog(key, plan.taken.generation, from_gen, len(data), plan.taken.mark)
    report.catalog_bytes += len(data)
    if from_gen is not None:
        report.delta_key, report.delta_rows = key, plan.taken.delta_rows
    else:
        report.whole_key = key
    report.catalog_key = report.catalog_key or key
    return data


def _drop_old_catalogs(bucket: Bucket, state: RemoteState, store_uuid: str, gen: int, keep_previous: bool) -> None:
    """After a whole catalog of generation `gen` went up: delete the store's catalog objects
    (whole or deltas, noted or not) older than the whole one before it (`keep_previous`, so
    that consumers following the deltas before it can still read them) or than this one."""
    objects = retained_catalogs(bucket, store_uuid)
    older = [c.generation for c in objects if c.from_gen is None and c.generation < gen]
    cut = older[-1] if keep_previous and older else gen
    old = [c.key for c in objects if c.generation < cut]
    if old:
        bucket.delete(old)
        state.forget_catalogs(old)


__all__ = ["PushReport", "push", "read_records"]
