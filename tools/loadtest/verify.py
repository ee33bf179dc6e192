"""Tree hashes (path -> sha256 of every regular file) through the mount and, unmounted,
through the Store API; their comparison; and the offline check after the run."""
from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tools.harnessutil import sha_file

from .errors import LoadError

MiB = 1 << 20


def tree_hashes(top: Path, threads: int = 4) -> tuple[dict[str, str], int]:
    """sha256 of every regular file under `top` (through the mount), and the bytes read.
    Several threads read at once: the mount serves them in parallel, and the controller
    gets its share of the CPU next to the writers."""
    paths: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames.sort()
        for name in sorted(filenames):
            p = Path(dirpath) / name
            if p.is_symlink() or not p.is_file():
                raise LoadError(f"{p}: not a regular file")
            paths.append(p)
    with ThreadPoolExecutor(threads) as pool:
        hashed = list(pool.map(sha_file, paths))
    out = {str(p.relative_to(top)): digest for p, (digest, _) in zip(paths, hashed)}
    return out, sum(n for _, n in hashed)


def compare_trees(got: dict[str, str], want: dict[str, str], skip: set[str]) -> list[str]:
    """Differences between two path -> sha256 maps, ignoring the top directories in `skip`."""
    problems = []
    for rel in sorted(set(got) | set(want)):
        if rel.split("/", 1)[0] in skip:
            continue
        if rel not in got:
            problems.append(f"{rel} is missing (sha256 {want[rel][:16]} expected)")
        elif rel not in want:
            problems.append(f"{rel} should not exist (sha256 {got[rel][:16]})")
        elif got[rel] != want[rel]:
            problems.append(f"{rel} holds sha256 {got[rel][:16]}, expected {want[rel][:16]}")
    return problems


def store_tree_hashes(store: Any, gen: int | None) -> tuple[dict[str, str], int]:
    """Like tree_hashes, for an open (unmounted) cowfs Store: the live tree (gen None) or a
    snapshot's generation."""
    from cowfs.store import ROOT_INO

    out: dict[str, str] = {}
    total = 0
    stack = [(ROOT_INO, "")]
    while stack:
        ino, prefix = stack.pop()
        for raw, attr in store.readdir(ino, gen):
            rel = prefix + raw.decode(errors="surrogateescape")
            if attr.is_dir:
                stack.append((attr.ino, rel + "/"))
                continue
            if attr.is_symlink:
                raise LoadError(f"{rel}: a symlink nobody made")
            out[rel] = _store_file_sha(store, rel, attr, gen)
            total += attr.size
    return out, total


def _store_file_sha(store: Any, rel: str, attr: Any, gen: int | None) -> str:
    h = hashlib.sha256()
    with store.open_reader(attr.ino, gen) as reader:
        pos = 0
        while pos < attr.size:
            piece = reader.read(pos, min(8 * MiB, attr.size - pos))
            if not piece:
                raise LoadError(f"{rel}: ends at {pos} of {attr.size} bytes")
            h.update(piece)
            pos += len(piece)
    return h.hexdigest()


def verify_offline(store_path: Path, snapshots: dict[str, dict[str, str]], live: dict[str, str],
                   skip: set[str]) -> tuple[list[str], int]:
    """Unmounted: every remaining snapshot holds exactly what was recorded when it was taken,
    and the live tree every writer's last versions (except the writers in `skip`)."""
    from cowfs.store import Store

    errors: list[str] = []
    total = 0
    with Store.open(store_path) as store:
        existing = {s.name: s for s in store.snapshot_list()}
        if set(existing) != set(snapshots):
            errors.append(f"snapshots after unmount: {sorted(existing)}, expected {sorted(snapshots)}")
        for name, files in snapshots.items():
            if name not in existing:
                continue
            got, n = store_tree_hashes(store, existing[name].gen)
            total += n
            # a writer that failed may have left anything in snapshots taken after it failed;
            # what was recorded must still be there either way
            errors += [f"snapshot {name} after unmount: {p}" for p in compare_trees(got, files, set())]
        got, n = store_tree_hashes(store, None)
        total += n
        errors += [f"live tree after unmount: {p}" for p in compare_trees(got, live, skip)]
    return errors, total
