"""What CLI commands do to a store, as functions of a Store returning JSON-able values.

The CLI calls them directly on an unmounted store; the mount daemon calls the
same functions for requests on its control socket. One implementation, two doors.
"""
from __future__ import annotations

from typing import Any, Callable

from .errors import CowfsError, InvalidArgument, IsADirectory, NotFound
from .service_remote import OPS as remote_ops
from .store import Store
from .store.checkpoints import index as checkpoint_index
from .store.checkpoints.index import TRAINER_ONLY, Checkpoint, CheckpointIndex
from .store.checkpoints.keep_best import Candidate, MetricSpec, ranked
from .store.checkpoints.keep_best import keep_best as keep_best_of
from .store.upkeep.retention import KeepPolicy, plan
from .units import duration_ns

Progress = Callable[[int, int], None]  # (done, total), called from the thread doing the work
WITH_PROGRESS = frozenset({"gc", "fsck", "prune", "compact", "remote_push", "remote_gc", "remote_fsck",
                           "remote_fetch"})


def _gen(store: Store, snapshot: str | None, generation: int | None) -> int | None:
    if snapshot is not None:  # an empty name is a name no snapshot has, not "live"
        return store.snapshot(snapshot).gen
    if generation is not None and not 1 <= generation <= store.generation:
        raise InvalidArgument(f"no generation {generation} (this store is at generation {store.generation})")
    return generation


def stats(store: Store) -> dict[str, Any]:
    return store.stats()


def snapshot_create(store: Store, name: str) -> dict[str, Any]:
    s = store.snapshot_create(name)
    return {"name": s.name, "generation": s.gen, "created_ns": s.created_ns}


def snapshot_list(store: Store, checkpoints: bool = True) -> list[dict[str, Any]]:
    """Snapshots, oldest first; with `checkpoints`, the HF Trainer checkpoint each is for (the
    one whose trainer_state.json it got last: its step, epoch, metrics) and the paths of
    every checkpoint it holds."""
    snaps = store.snapshot_list()
    out = [{"name": s.name, "generation": s.gen, "created_ns": s.created_ns} for s in snaps]
    if not checkpoints or not snaps:
        return out
    idx = checkpoint_index.build(store, snaps, live=False, kinds=TRAINER_ONLY)
    by_key = idx.by_key()
    for row in out:
        held = [by_key[k] for k in idx.in_snapshot.get(row["name"], [])]
        paths = [_path_in(c, row["name"]) for c in held]
        row["checkpoint"] = {"path": paths[0], **_state_json(held[0])} if held else None
        row["checkpoints"] = paths
    return out


def _path_in(c: Checkpoint, snapshot: str | None) -> str:
    return next(loc.path for loc in c.locations if loc.snapshot == snapshot)


def _state_json(c: Checkpoint) -> dict[str, Any]:
    """step, epoch and metrics: from trainer_state.json, else the step in the name and no metrics."""
    if c.state is not None:
        return c.state.to_json()
    return {"step": c.step, "epoch": None, "metrics": {}, "metrics_step": None, "best_metric": None,
            "best_model_checkpoint": None}


def _checkpoint_json(c: Checkpoint) -> dict[str, Any]:
    src = c.restore_from
    return {"kind": c.kind, "type": "dir" if c.is_dir else "file", "path": c.path, **_state_json(c), "generation": c.saved_gen, "saved_ns": c.saved_ns,
            "live": c.live is not None, "snapshot": src.snapshot if src else None,
            "snapshot_path": src.path if src else None, "snapshots": c.snapshots}


def _exists_somewhere(store: Store, path: str) -> None:
    """NotFound unless `path` exists in the live tree or in some snapshot."""
    for gen in [None, *(s.gen for s in reversed(store.snapshot_list()))]:
        try:
            store.resolve(path, gen)
            return
        except CowfsError:
            continue
    raise NotFound(f"{path}: not in the live tree nor in any snapshot")


def checkpoints(store: Store, path: str = "/", sort: str | None = None) -> dict[str, Any]:
    """Every complete checkpoint (HF Trainer, Lightning, DCP, DeepSpeed) under `path` in any
    snapshot or the live tree, each once, the newest save first (or the best by `sort`,
    METRIC[:min|max], first; those without the metric last, newest first)."""
    if path.strip("/"):
        _exists_somewhere(store, path)
    spec = MetricSpec.parse(sort) if sort else None
    idx = checkpoint_index.build(store, under=path)
    found = idx.checkpoints
    if spec is not None:
        order = {c.key: i for i, c in enumerate(ranked(_candidates(idx), spec))}
        found = sorted(found, key=lambda c: order.get(c.key, len(order)))  # without the metric: last, newest first
    return {"checkpoints": [_checkpoint_json(c) for c in found], "truncated": idx.truncated}


def _candidates(idx: CheckpointIndex) -> list[Candidate]:
    """The Trainer checkpoints (the only ones with metrics) as --keep-best and --sort candidates."""
    held_with = {name: len(keys) for name, keys in idx.in_snapshot.items()}
    return [Candidate(c.key, c.state.global_step, c.path, c.state.metrics, tuple(c.snapshots), c.own_snapshot,
                      held_with) for c in idx.checkpoints if c.state is not None]


def snapshot_delete(store: Store, names: list[str]) -> list[str]:
    for name in names:
        store.snapshot(name)  # every name must exist before any is deleted
    for name in names:
        store.snapshot_delete(name)
    return names


def gc(store: Store, progress: Progress | None = None) -> dict[str, Any]:
    r = store.gc(progress)
    return {"chunks_deleted": r.chunks_deleted, "bytes_freed": r.bytes_freed,
            "physical_bytes": r.physical_after, "seconds": round(r.seconds, 3)}


def compact(store: Store, progress: Progress | None = None) -> dict[str, Any]:
    """Re-cut and encode every body not compacted yet (docs/cli.md lists the keys)."""
    before = store.stats()
    r = store.compact(progress)
    after = store.stats()
    return {"bodies": r.bodies, "recut": r.recut, "logical_bytes": r.logical_bytes, "pieces": r.pieces,
            "new_chunks": r.new_chunks, "new_stored_bytes": r.new_stored_bytes, "deltas": r.deltas,
            "delta_saved_bytes": r.delta_saved_bytes, "regrouped": r.regrouped, "rewritten": r.rewritten, "stored_bytes_before": before["stored_bytes"],
            "stored_bytes": after["stored_bytes"], "logical_bytes_total": after["logical_bytes"],
            "errors": r.errors, "seconds": round(r.seconds, 3),
            "gc_chunks_deleted": r.gc_chunks_deleted, "gc_bytes_freed": r.gc_bytes_freed}


def fsck(store: Store, repair: bool = False, progress: Progress | None = None) -> dict[str, Any]:
    """Check (and with `repair`, fix, then check again). Keys are documented in docs/cli.md."""
    report = store.fsck(repair=repair, progress=progress)
    after = store.fsck() if repair and report.problems else report
    return {
        "clean": after.clean,
        "problems": [p.line() for p in report.problems],
        "repaired": report.repaired,
        "remaining": [p.line() for p in after.problems],
        "chunks_checked": report.chunks_checked,
        "bytes_checked": report.bytes_checked,
        "segments_checked": report.segments_checked,
        "segments_evicted": report.segments_evicted,
        "unreferenced_bytes": report.unreferenced_bytes,
        "seconds": round(report.seconds, 3),
    }


def log(store: Store, path: str) -> list[dict[str, Any]]:
    return [
        {"generation": v.birth_gen, "time_ns": v.time_ns, "size": v.size, "added_bytes": v.added_bytes,
         "added_stored_bytes": v.added_stored_bytes, "current": v.death_gen is None}
        for v in store.history(path)
    ]


def ls(store: Store, path: str, snapshot: str | None = None, generation: int | None = None) -> list[dict[str, Any]]:
    gen = _gen(store, snapshot, generation)
    attr = store.resolve(path, gen)
    entries = store.readdir(attr.ino, gen) if attr.is_dir else [(path.rstrip("/").rsplit("/", 1)[-1].encode(), attr)]
    return [
        {"name": name.decode(errors="surrogateescape"), "kind": a.kind,
         "mode": a.mode & 0o7777, "size": a.size, "mtime_ns": a.mtime_ns}
        for name, a in entries
    ]


def file_size(store: Store, path: str, snapshot: str | None = None, generation: int | None = None) -> int:
    attr = store.resolve(path, _gen(store, snapshot, generation))
    if attr.is_dir:
        raise IsADirectory(f"{path}: is a directory")
    return attr.size


def read(store: Store, path: str, offset: int, length: int, snapshot: str | None = None, generation: int | None = None) -> bytes:
    gen = _gen(store, snapshot, generation)
    attr = store.resolve(path, gen)
    with store.open_reader(attr.ino, gen) as reader:
        return bytes(reader.read(offset, length))


LIVE_REF = "@live"


def resolve_ref(store: Store, ref: str) -> int | None:
    """A snapshot name, `@live` (None: the live tree) or `@G` for generation G."""
    if ref == LIVE_REF:
        return None
    if ref.startswith("@"):
        try:
            gen = int(ref[1:])
        except ValueError:
            raise InvalidArgument(f"{ref!r}: expected a snapshot name, {LIVE_REF} or @GENERATION") from None
        if not 1 <= gen <= store.generation:
            raise InvalidArgument(f"{ref!r}: generation {gen} does not exist (the store is at {store.generation})")
        return gen
    return store.snapshot(ref).gen


def diff(store: Store, a: str, b: str = LIVE_REF) -> dict[str, Any]:
    gen_a = resolve_ref(store, a)
    r = store.diff(store.generation if gen_a is None else gen_a, resolve_ref(store, b))
    return {
        "a": {"ref": a, "generation": r.gen_a},
        "b": {"ref": b, "generation": r.gen_b},
        "entries": [{"change": e.change, "path": e.path, "kind": e.kind, "size_a": e.size_a, "size_b": e.size_b,
                     "shared_bytes": e.shared_bytes} for e in r.entries],
        "summary": {"added": r.count("added"), "removed": r.count("removed"), "changed": r.count("changed"),
                    "unchanged": r.unchanged, "new_bytes": r.new_bytes},
    }


def restore(store: Store, path: str, snapshot: str | None = None, generation: int | None = None,
            to: str | None = None) -> dict[str, Any]:
    """A file (a new version) or a whole directory (made anew, in one transaction) as of a
    snapshot or generation, back in the live tree."""
    gen = _gen(store, snapshot, generation)
    if gen is None:
        raise InvalidArgument("restore needs --snapshot or --generation")
    if store.resolve(path, gen).is_dir:
        tree = store.restore_tree(path, gen, to)
        return {"path": to or path, "kind": "dir", "ino": tree.root.ino, "parent_ino": tree.parent,
                "files": len(tree.files), "size": tree.bytes, "generation": tree.root.birth_gen}
    attr = store.restore(path, gen, to)
    return {"path": to or path, "kind": "file", "ino": attr.ino, "files": 1, "size": attr.size,
            "generation": attr.birth_gen}


def prune(store: Store, keep_last: int = 0, keep_within: str | None = None, keep_hourly: int = 0,
          keep_daily: int = 0, keep_weekly: int = 0, keep_name: list[str] | None = None,
          keep_history: str | None = None, dry_run: bool = False, run_gc: bool = True,
          keep_best: list[list[Any]] | None = None, progress: Progress | None = None) -> dict[str, Any]:
    """`keep_best`: [[METRIC[:min|max], N], ...] (keep_best.py), on top of the other rules."""
    policy = KeepPolicy(keep_last, duration_ns(keep_within) if keep_within else 0, keep_hourly, keep_daily,
                        keep_weekly, tuple(keep_name or ()))
    best_rules = [(MetricSpec.parse(str(spec)), _count(n)) for spec, n in keep_best or []]
    snaps = store.snapshot_list()
    decisions = plan(snaps, policy, more_rules=bool(best_rules))
    best = []
    if best_rules:
        candidates = _candidates(checkpoint_index.build(store, snaps, live=False, kinds=TRAINER_ONLY))
        for spec, n in best_rules:
            best += keep_best_of(decisions, candidates, spec, n)
    out: dict[str, Any] = {
        "snapshots": [{"name": d.snapshot.name, "generation": d.snapshot.gen, "created_ns": d.snapshot.created_ns,
                       "keep": d.keep, "reasons": d.reasons} for d in decisions],
        "best": [b.to_json() for b in best], "dry_run": dry_run, "history_rows_dropped": 0, "gc": None,
    }
    if dry_run:
        return out
    for d in decisions:
        if not d.keep:
            store.snapshot_delete(d.snapshot.name)
    out["history_rows_dropped"] = store.expire_history(duration_ns(keep_history) if keep_history else 0)
    if run_gc:
        out["gc"] = gc(store, progress)
    return out


def _count(n: Any) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, str)) or not str(n).isdigit():
        raise InvalidArgument(f"--keep-best: N must be a whole number, not {n!r}")
    return int(n)


OPS: dict[str, Callable[..., Any]] = {
    "stats": stats,
    "snapshot_create": snapshot_create,
    "snapshot_list": snapshot_list,
    "snapshot_delete": snapshot_delete,
    "gc": gc,
    "compact": compact,
    "fsck": fsck,
    "log": log,
    "ls": ls,
    "file_size": file_size,
    "read": read,
    "restore": restore,
    "prune": prune,
    "diff": diff,
    "checkpoints": checkpoints,
    **remote_ops,
}
