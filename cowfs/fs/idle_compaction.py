"""The daemon's compactor: once no file has been open for writing for a while, committed
files are compacted (store/tensors/compact.py) in worker threads; a file opened for writing stops
the run at its next step (the body in hand is left as it was, and done next time)."""
from __future__ import annotations

import logging
import time

import trio

from ..errors import CowfsError
from .handles import HandleTable
from .operations import CowfsOperations

log = logging.getLogger("cowfs.compact")
CHECK_EVERY = 1.0  # seconds between looks at the writers (an idle daemon wakes this often)
# the log line of a run (tools/bench reads the daemon's runs from it)
COMPACTED_LOG = "compacted %d files (%d bytes): %d new pieces, %d deltas, %d regrouped, in %.2fs"


def quiet_for(handles: HandleTable) -> float:
    """Seconds since a file was last open for writing (0 while one is)."""
    if handles.writers_open():
        return 0.0
    return time.monotonic() - handles.last_write_end


async def compact_when_idle(ops: CowfsOperations, idle: float) -> None:
    handles = ops.handles
    while True:
        await trio.sleep(min(CHECK_EVERY, idle))
        if quiet_for(handles) < idle or handles.write_seq == handles.compacted_seq:
            continue
        seq = handles.write_seq  # writes up to here will be compacted by this run
        try:
            report = await trio.to_thread.run_sync(
                lambda: ops.store.compact(stop=lambda: handles.writers_open() or handles.unmounting))
        except CowfsError as e:  # e.g. a full device: tried again after the next write, not at once
            log.warning("compaction stopped: %s", e)
            handles.compacted_seq = seq
            continue
        except Exception:  # noqa: BLE001 - the daemon goes on serving; fsck will tell
            log.exception("compaction failed")
            handles.compacted_seq = seq
            continue
        for error in report.errors:
            log.warning("compaction: %s", error)
        if report.recut or report.deltas or report.regrouped:
            log.info(COMPACTED_LOG, report.recut, report.logical_bytes, report.new_chunks, report.deltas,
                     report.regrouped, report.seconds)
        if not report.stopped:
            handles.compacted_seq = seq
