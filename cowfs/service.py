"""What CLI commands do to a store, as functions of a Store returning JSON-able values.

The CLI calls them directly on an unmounted store; the mount daemon calls the
same functions for requests on its control socket. One implementation, two doors.
"""
from __future__ import annotations

from typing import Any, Callable

from .store import Store


def _gen(store: Store, snapshot: str | None, generation: int | None) -> int | None:
    if snapshot:
        return store.snapshot(snapshot).gen
    return generation


def stats(store: Store) -> dict[str, Any]:
    return store.stats()


def snapshot_create(store: Store, name: str) -> dict[str, Any]:
    s = store.snapshot_create(name)
    return {"name": s.name, "generation": s.gen, "created_ns": s.created_ns}


def snapshot_list(store: Store) -> list[dict[str, Any]]:
    return [{"name": s.name, "generation": s.gen, "created_ns": s.created_ns} for s in store.snapshot_list()]


def snapshot_delete(store: Store, names: list[str]) -> list[str]:
    for name in names:
        store.snapshot(name)  # every name must exist before any is deleted
    for name in names:
        store.snapshot_delete(name)
    return names


def gc(store: Store) -> dict[str, Any]:
    r = store.gc()
    return {"chunks_deleted": r.chunks_deleted, "bytes_freed": r.bytes_freed,
            "physical_bytes": r.physical_after, "seconds": round(r.seconds, 3)}


def log(store: Store, path: str) -> list[dict[str, Any]]:
    return [
        {"generation": v.birth_gen, "time_ns": v.time_ns, "size": v.size, "added_bytes": v.added_bytes,
         "current": v.death_gen is None}
        for v in store.history(path)
    ]


def ls(store: Store, path: str, snapshot: str | None = None, generation: int | None = None) -> list[dict[str, Any]]:
    gen = _gen(store, snapshot, generation)
    attr = store.resolve(path, gen)
    entries = store.readdir(attr.ino, gen) if attr.is_dir else [(path.rstrip("/").rsplit("/", 1)[-1].encode(), attr)]
    return [
        {"name": name.decode(errors="surrogateescape"), "kind": "dir" if a.is_dir else "symlink" if a.is_symlink else "file",
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
        return reader.read(offset, length)


OPS: dict[str, Callable[..., Any]] = {
    "stats": stats,
    "snapshot_create": snapshot_create,
    "snapshot_list": snapshot_list,
    "snapshot_delete": snapshot_delete,
    "gc": gc,
    "log": log,
    "ls": ls,
    "file_size": file_size,
    "read": read,
}

from .errors import IsADirectory  # noqa: E402
