"""In-mount gc, prune and compact requests while the writer runs: `prune --keep-name
SNAP_GLOB --keep-history 0` keeps every harness snapshot but drops the history no snapshot
holds, so gc really punches and deletes segments under the writer; `compact` re-cuts the
writer's torch.save and safetensors files into tensor pieces and re-encodes older pieces as
deltas, so kills land inside compactions too."""
from __future__ import annotations

import random
import time
from pathlib import Path

from cowfs.control import DaemonTarget

from .cycle import Cycle
from .gc_requests import GcRequest
from .snapshots import SNAP_GLOB


def send_gc_requests(cyc: Cycle, store: Path, max_run: float, rng: random.Random) -> None:
    """The gc thread of a cycle: gc, prune and compact requests to the daemon, as `cowfs gc MNT`,
    `cowfs prune MNT --keep-name GLOB --keep-history 0` and `cowfs compact MNT` send them (straight to the daemon's
    socket: never a fallback that would open the store in this process)."""
    n = 0
    while not cyc.stop.wait(rng.uniform(0.05, 0.4 * max_run) if n == 0 else rng.uniform(0.2, 0.8)):
        if cyc.fired.is_set():
            return
        n += 1
        req = GcRequest(n, rng.choices(["prune", "gc", "compact"], [0.45, 0.3, 0.25])[0], time.monotonic())
        cyc.gc_requests.append(req)
        if cyc.kill_point.kind == "gc" and n == cyc.kill_point.nth:
            cyc.fire_later(f"gc#{n} {req.op}")
        if not send_one(cyc, store, req):
            return


def send_one(cyc: Cycle, store: Path, req: GcRequest) -> bool:
    """Send `req` and wait for its answer. False if it failed (expected only once the daemon is killed)."""
    def progress(done: int, total: int) -> None:
        if req.progress is None and cyc.kill_point.kind == "gc-punch" and req.n == cyc.kill_point.nth:
            cyc.fire_later(f"gc#{req.n} {req.op} punching")
        req.progress = (done, total)

    try:
        conn = DaemonTarget(store)
        try:
            args = {"keep_name": [SNAP_GLOB]} if req.op == "prune" else {}
            result = conn.call(req.op, progress=progress, **args)
        finally:
            conn.close()
    except Exception as e:  # noqa: BLE001 - expected only once the daemon is killed
        req.error = repr(e)
        if not cyc.fired.is_set():
            cyc.errors.append(f"in-mount {req.op}: {e!r} while the daemon was alive")
        return False
    req.t_done = time.monotonic()
    req.result = result
    if req.op == "prune" and (gone := [s["name"] for s in result["snapshots"] if not s["keep"]]):
        cyc.errors.append(f"in-mount prune removed snapshots {gone}: they all match {SNAP_GLOB!r}")
    return True
