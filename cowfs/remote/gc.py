"""Remote gc: deleting the packs no retained catalog of any store sharing the prefix uses, by
mark and sweep (docs/design.md section 17, "Remote gc"; the doomed list's bytes are in
docs/format.md section 9.9).

`collect` runs an upload pass (so the store's newest catalog reflects its local gc and
prune), then sweeps the doomed lists older than their grace period, then marks:

- *Mark*: the live set is every hash in the `chunks` table of every catalog object in
  `stores/*/catalog/`; a pack none of whose chunks is live, older than the grace period on
  the engine's clock and named by no doomed list yet, goes into one new doomed list
  `gc/NAME.doomed`. Upload passes from then on count its chunks as not in the bucket.
- *Sweep*: for each doomed list older than its grace period (its LastModified against the
  engine's Date), the live set is computed again from the catalogs retained now; each pack
  it names that is still unused and was not PUT again since the mark loses its index, then
  its object; then the list is deleted. Packs used again are kept.

Incomplete multipart uploads older than the grace period are aborted too.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from ..errors import InvalidArgument
from .catalogs import LiveSet
from .doomed import CLOCK_STEP, MIN_GRACE, DoomedPack, doomed_key, encode_doomed, list_doomed
from .s3 import Bucket, ListedObject
from .state import RemoteState
from .bucket_look import index_key, pack_key, refresh
from .upload import push

if TYPE_CHECKING:
    from ..store import Store

log = logging.getLogger("cowfs.remote")
DEFAULT_GRACE = 3600.0


@dataclass
class GcReport:
    grace_seconds: float = DEFAULT_GRACE
    generation: int = 0  # the catalog generation the pass before put in the bucket
    catalogs: int = 0  # catalog objects read, of every store (once per sweep and per mark)
    live_chunks: int = 0  # chunk hashes they hold (the larger of the sweep's and the mark's count)
    swept_lists: int = 0  # doomed lists older than their grace period, swept and deleted
    deleted_packs: int = 0
    deleted_bytes: int = 0
    kept_packs: int = 0  # doomed but used again at the sweep (or PUT again since the mark): kept
    waiting_lists: int = 0  # doomed lists not yet older than their grace period
    marked_packs: int = 0
    marked_bytes: int = 0
    doomed_list: str | None = None  # the key of the doomed list this gc wrote (None: nothing to mark)
    damaged_lists: int = 0  # doomed lists that did not decode, deleted (nothing is deleted by them)
    aborted_uploads: int = 0  # incomplete multipart uploads older than the grace period
    seconds: float = 0.0

    def to_json(self) -> dict[str, object]:
        return dict(self.__dict__)


def check_grace(grace: float) -> None:
    if grace < MIN_GRACE:
        raise InvalidArgument(f"--grace {grace:g}s is too short: at least {MIN_GRACE:g}s (upload passes rely on it; "
                              "the default is 1h)")


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


def _listing(bucket: Bucket, kind: str) -> dict[str, ListedObject]:
    prefix = bucket.key(kind, "")
    return {o.key[len(prefix):]: o for o in bucket.list(prefix)}


class _Live:
    """The live set attached to remote.db's connection: which packs hold a live chunk."""

    def __init__(self, state: RemoteState, live: LiveSet) -> None:
        self.state = state
        state.conn.execute("ATTACH DATABASE ? AS gclive", (str(live.path),))

    def holds(self, pack: str) -> bool:
        row = self.state.conn.execute("SELECT EXISTS (SELECT 1 FROM objects o JOIN gclive.live l ON l.hash = o.hash"
                                      " WHERE o.pack = ?)", (pack,)).fetchone()
        return bool(row[0])

    def close(self) -> None:
        self.state.conn.execute("DETACH DATABASE gclive")


def _live(bucket: Bucket, state: RemoteState, tmpdir: Path, report: GcReport) -> LiveSet:
    """The live set of the catalogs retained now; then remote.db learns the indexes listed
    now, so every pack's chunks are known to the checks that follow."""
    live = LiveSet(tmpdir)
    try:
        live.add_bucket(bucket)
        refresh(bucket, state, adopt=False)
    except BaseException:
        live.close()
        raise
    report.catalogs += len(live.catalogs)
    report.live_chunks = max(report.live_chunks, len(live))
    return live


def sweep(bucket: Bucket, state: RemoteState, tmpdir: Path, grace: float, report: GcReport) -> None:
    """Delete the still unused packs of every doomed list older than its grace period."""
    now = bucket.clock()
    listed = list_doomed(bucket)
    due = [d for d in listed if d.due(now)]
    report.waiting_lists = sum(1 for d in listed if d.doomed is not None and not d.due(now))
    damaged = [d for d in listed if d.doomed is None and now - d.modified >= grace + CLOCK_STEP]
    for d in damaged:
        log.warning("deleting %s: %s (no pack was deleted by it)", d.key, d.error)
    if damaged:
        bucket.delete([d.key for d in damaged])
        report.damaged_lists = len(damaged)
    if not due:
        return
    with _live(bucket, state, tmpdir, report) as live:
        stored = _listing(bucket, "packs")
        attached = _Live(state, live)
        try:
            for d in due:
                assert d.doomed is not None
                gone: list[DoomedPack] = []
                for p in d.doomed.packs:
                    obj = stored.get(p.name)
                    if obj is not None and (_ms(obj.modified) != p.modified_ms or attached.holds(p.name)):
                        report.kept_packs += 1  # PUT again since the mark, or used again
                    else:
                        gone.append(p)  # unused, or an index whose pack is gone (nothing reads by it)
                # every index before its pack: a crash between leaves packs without an index,
                # still named by this list, which the next sweep deletes
                bucket.delete([index_key(bucket, p.name) for p in gone])
                bucket.delete([pack_key(bucket, p.name) for p in gone])
                state.forget_packs(p.name for p in gone)
                bucket.delete([d.key])
                report.swept_lists += 1
                report.deleted_packs += len(gone)
                report.deleted_bytes += sum(stored[p.name].size for p in gone if p.name in stored)
        finally:
            attached.close()


def mark(bucket: Bucket, state: RemoteState, tmpdir: Path, grace: float, store_uuid: str, report: GcReport) -> None:
    """Write one doomed list of the packs no retained catalog uses, older than `grace`."""
    now = bucket.clock()  # read before the listings: ages are never overstated
    already = {p.name for d in list_doomed(bucket) if d.doomed is not None for p in d.doomed.packs}
    with _live(bucket, state, tmpdir, report) as live:
        known = state.known_packs()
        indexes, stored = _listing(bucket, "index"), _listing(bucket, "packs")
        attached = _Live(state, live)
        try:
            doomed: list[DoomedPack] = []
            for name in sorted(set(indexes) | set(stored)):
                pack = stored.get(name)
                obj = pack or indexes[name]
                if name in already or now - obj.modified < grace + CLOCK_STEP:
                    continue  # doomed already, or young: a pass may be about to name it in a catalog
                if pack is not None and name in indexes and (name not in known or attached.holds(name)):
                    continue  # used (or its index was not read: what it holds is unknown)
                # unused, or a pack without an index (no reader can find a chunk in it), or an
                # index whose pack is gone (nothing can be read by it)
                doomed.append(DoomedPack(name, pack.size if pack else 0, _ms(pack.modified) if pack else 0))
        finally:
            attached.close()
    if not doomed:
        return
    name, data = encode_doomed(grace, time.time_ns(), store_uuid, doomed)
    bucket.put(doomed_key(bucket, name), data)
    report.doomed_list = doomed_key(bucket, name)
    report.marked_packs = len(doomed)
    report.marked_bytes = sum(p.size for p in doomed)


def abort_uploads(bucket: Bucket, grace: float, report: GcReport) -> None:
    """Abort the prefix's multipart uploads begun more than `grace` ago (passes cut short)."""
    now = bucket.clock()
    for up in list(bucket.incomplete_uploads(bucket.key(""))):
        if now - up.initiated >= grace + CLOCK_STEP:
            bucket.abort_upload(up)
            report.aborted_uploads += 1


def collect(store: "Store", bucket: Bucket, state: RemoteState, grace: float = DEFAULT_GRACE,
            progress: Callable[[int, int], None] | None = None) -> GcReport:
    """An upload pass, then sweep, then mark (see the module text)."""
    check_grace(grace)
    t0 = time.monotonic()
    report = GcReport(grace_seconds=grace)
    report.generation = push(store, bucket, state, progress=progress, whole=True).generation
    tmpdir = store.root / "tmp"
    sweep(bucket, state, tmpdir, grace, report)
    mark(bucket, state, tmpdir, grace, store.config.store_uuid, report)
    abort_uploads(bucket, grace, report)
    report.seconds = round(time.monotonic() - t0, 3)
    return report
