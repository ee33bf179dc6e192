"""The inspect process (`python -m tools.crashtest _inspect SPEC.json`): opens the unmounted
store with the Store API and reads back every version in the history of each path closed
this cycle; then expires history if the spec says so. Prints one JSON object."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from cowfs.errors import NotFound
from cowfs.store import Store
from cowfs.store.catalog import namespace as ns

from .states import EMPTY


def read_path_history(s: Store, path: str, spec: dict[str, Any], out: dict[str, Any]) -> None:
    """Every version of every inode `path` ever named: what it holds (out["found"][path]), and
    problems with what must never be there; writes the versions listed in spec["dump"]."""
    problems: list[str] = out["problems"]
    allowed = set(spec["ever"][path])
    dump: dict[str, str] = spec["dump"]  # sha -> file to write it to
    try:
        inos = s.catalog.read(lambda conn: ns.inodes_ever_at(conn, "/" + path))
    except NotFound:
        inos = []  # an in-mount prune dropped every name the path had
    births: dict[str, list[int]] = {}
    for ino in inos:
        for v in s.history(ino):
            what = f"history of {path}: version born at gen {v.birth_gen}"
            try:
                with s.open_reader(ino, v.birth_gen) as reader:
                    data = reader.read(0, reader.size)
            except Exception as e:  # noqa: BLE001 - reported
                problems.append(f"{what} unreadable: {e!r}")
                continue
            digest = hashlib.sha256(data).hexdigest()
            births.setdefault(digest, []).append(v.birth_gen)
            out["versions"] += 1
            out["bytes"] += len(data)
            if digest not in allowed:
                problems.append(f"{what} ({len(data)} bytes, sha {digest[:12]}) is no complete version "
                                f"the writer wrote")
            elif digest == EMPTY and v.death_gen is not None:
                problems.append(f"{what} is empty and was replaced at gen {v.death_gen}: an empty "
                                f"intermediate state (a create's empty body is not history)")
            if digest in dump and not os.path.exists(dump[digest]):
                Path(dump[digest]).write_bytes(data)
    out["found"][path] = sorted(births)
    gens = [min(births[d]) for d in spec["order"][path] if d in births]
    if any(b <= a for a, b in zip(gens, gens[1:])):
        problems.append(f"history of {path}: the closed versions are not born in close order "
                        f"(generations {gens} in close order)")


def main(argv: list[str]) -> int:
    """Reports what it found per path (the harness judges what is missing) and what must never
    be there; writes the bytes of the versions listed in spec["dump"] to files, for the harness
    to load."""
    spec = json.loads(Path(argv[0]).read_text())
    out: dict[str, Any] = {"problems": [], "found": {}, "versions": 0, "bytes": 0, "expired": None}
    with Store.open(spec["store"]) as s:
        for path in spec["closed"]:
            read_path_history(s, path, spec, out)
        if spec.get("expire"):
            out["expired"] = s.expire_history(0)
    print(json.dumps(out))
    return 0
