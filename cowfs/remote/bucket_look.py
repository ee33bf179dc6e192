"""Looking at the bucket before and during an upload pass (docs/design.md, section 17): the
object names, and `refresh`, which notes the doomed packs, learns the indexes of packs the
store does not know, forgets the packs that are gone and adopts a pack whose index a crash
kept from being written."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable

from ..errors import CorruptData
from . import deltas
from .doomed import MIN_GRACE, look_at_gc
from .packs import PackIndex, decode_index, encode_index, entries_of_pack, is_pack_name, pack_name
from .s3 import Bucket, MissingObject
from .state import RemoteState

log = logging.getLogger("cowfs.remote")


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


def delta_key(bucket: Bucket, store_uuid: str, gen: int, from_gen: int) -> str:
    return bucket.key("stores", store_uuid, "catalog", deltas.delta_name(gen, from_gen))


FRESH = MIN_GRACE / 4  # s: a look at gc/ begun this recently stands in for the one before a catalog's PUT
INDEX_EVERY = MIN_GRACE / 2  # s: index/ is listed again after this long (or sooner when something is gone)
ADOPT_EVERY = 300.0  # s: packs/ is listed for packs without an index at least this often


@dataclass
class Looks:
    """When one tier last looked at each part of the bucket (time.monotonic(); None: not yet),
    which tells a pass which LISTs it can leave out (docs/design.md section 17, "Fewer looks
    per pass"). A new Looks makes every look: the tier's first pass, and `cowfs remote gc`'s."""
    gc: float | None = None  # when the last look at gc/ began
    index: float | None = None  # when index/ was last listed
    packs: float | None = None  # when packs/ was last listed
    failed: bool = False  # a pass failed since packs/ was last listed (it may have left a pack without its index)
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)

    def gc_fresh(self, now: float) -> bool:
        return self.gc is not None and now - self.gc < FRESH

    def index_due(self, now: float) -> bool:
        return self.index is None or now - self.index >= INDEX_EVERY

    def packs_due(self, now: float) -> bool:
        return self.packs is None or self.failed or now - self.packs >= ADOPT_EVERY


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


def refresh(bucket: Bucket, state: RemoteState, adopt: bool = True, indexes: bool = True,
            looks: Looks | None = None) -> Look:
    """Note the doomed packs; read the indexes of packs this store does not know yet and
    forget the packs whose index (or, with `adopt`, object) is gone; with `adopt`, index
    orphan packs. `indexes=False` lists `index/` only if a doomed list noted before is gone.

    With `looks` (a pass's looks, updated here) `index/` is listed only when it is due or a
    noted list is gone, and `packs/` (with `adopt`) only when it is due or a known pack's
    index is gone; `indexes` and `adopt` still say whether they may be.

    `gc/` is listed first: a sweep deletes a pack's index, then the pack, then the list that
    named it, so a pack this look sees neither doomed nor gone was not being deleted by a
    list it missed."""
    look = Look()
    began = (looks.clock if looks is not None else time.monotonic)()
    swept, noted = look_at_gc(bucket, state)
    look.doomed_lists = len(noted)
    if looks is not None:
        looks.gc = began
        indexes = indexes and (looks.index_due(began) or (adopt and looks.packs_due(began)))
    if not indexes and not swept:
        return look
    look.indexes_listed = True
    if looks is not None:
        looks.index = began
    known = state.known_packs()
    indexed = indexed_packs(bucket)
    stored: set[str] | None = None
    if adopt and looks is not None and not looks.packs_due(began) and known <= indexed:
        adopt = False  # no pass failed lately and no known pack lost its index: orphans are unlikely
    if adopt:
        if looks is not None:
            looks.packs, looks.failed = began, False
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


__all__ = ["Look", "Looks", "FRESH", "INDEX_EVERY", "ADOPT_EVERY", "refresh", "pack_key", "index_key", "indexed_packs", "read_index", "catalog_key",
           "delta_key"]
