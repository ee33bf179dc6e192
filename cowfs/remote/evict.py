"""Keeping the local log under its limit: after an upload pass, sealed segments whose
records are all in the bucket are evicted (store/upkeep/evict.py does each one safely), those only
older versions and snapshots read first (`eviction_order`), until the segment files take no
more than the store's `local_limit` (docs/design.md, section 17, "Capacity"). Reads of an
evicted segment fetch from the packs (evicted_reads.py)."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..store.upkeep.evict import BucketRecord, evict_segment, evicted_count, eviction_order
from ..store.upkeep.stats import physical_bytes
from .state import RemoteState

if TYPE_CHECKING:
    from ..store import Store


@dataclass
class EvictReport:
    limit: int
    local_bytes: int = 0  # segment files on the local disk after the pass
    segments: int = 0  # evicted by this pass
    bytes: int = 0  # local bytes they took
    current_bytes: int = 0  # of those, stored bytes of chunks the current tree reads (a resume fetches them)
    evicted_total: int = 0  # segments kept only in the bucket now
    kept: dict[str, int] = field(default_factory=dict)  # why segments over the limit stay: reason -> count

    def to_json(self) -> dict[str, object]:
        return dict(self.__dict__)


def bucket_records(state: RemoteState, hashes: list[bytes]) -> dict[bytes, list[BucketRecord]]:
    """Where the bucket (as remote.db knows it) holds each of `hashes`: every pack, those no
    doomed list names first (a doomed pack that still holds a chunk of a retained catalog is
    kept by the sweep, but a sound one is the better choice)."""
    return {h: [BucketRecord(pack, size, e.offset, e.stored_len, e.codec) for pack, size, e in held]
            for h, held in state.holders(hashes).items()}


def evict(store: "Store", state: RemoteState, limit: int) -> EvictReport:
    """Evict segments in the bucket, in `eviction_order`, until the local segment files fit in
    `limit`. Only chunks committed by the generation of the newest catalog in the bucket count."""
    report = EvictReport(limit)
    used = physical_bytes(store.root)
    uploaded_gen = state.last_catalog()
    kept: Counter[str] = Counter()
    if used > limit:
        for seg_id, size, current in eviction_order(store):
            if used <= limit:
                break
            why = evict_segment(store, seg_id, lambda hs: bucket_records(state, hs), uploaded_gen)
            if why is None:
                used -= size
                report.segments += 1
                report.bytes += size
                report.current_bytes += current
            else:
                kept[why] += 1
    report.local_bytes = physical_bytes(store.root)
    if report.local_bytes > limit and not kept:
        kept["it is the segment taking appends (its preallocation counts)"] += 1
    report.evicted_total = evicted_count(store)
    report.kept = dict(kept)
    return report
