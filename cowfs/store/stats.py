"""What `cowfs stats` reports: logical bytes (every version's size, each body once per
file), stored bytes (distinct chunks), physical bytes (blocks the segment files use)."""
from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from . import namespace as ns
from .layout import SEGMENTS_DIR
from .schema import LIVE


def physical_bytes(root: Path) -> int:
    total = 0
    for path in (root / SEGMENTS_DIR).glob("*.seg"):
        try:
            total += path.stat().st_blocks * 512
        except FileNotFoundError:
            pass
    return total


def catalog_stats(conn: sqlite3.Connection) -> dict[str, Any]:
    # a metadata-only version (chmod, utimens) shares its body: count each body once per file
    logical, versions = conn.execute(
        "SELECT coalesce(sum(size), 0), count(*) FROM"
        " (SELECT DISTINCT ino, content_id, size FROM versions WHERE content_id IS NOT NULL)"
    ).fetchone()
    stored, chunks = conn.execute("SELECT coalesce(sum(raw_len), 0), count(*) FROM chunks").fetchone()
    files = conn.execute(
        "SELECT count(*) FROM versions WHERE death_gen=? AND mode & 0xF000 = 0x8000", (LIVE,)
    ).fetchone()[0]
    snaps = conn.execute("SELECT count(*) FROM snapshots").fetchone()[0]
    return {"logical_bytes": logical, "stored_bytes": stored, "files": files, "versions": versions,
            "chunks": chunks, "snapshots": snaps, "generations": ns.current_gen(conn)}


def report(conn_stats: dict[str, Any], physical: int) -> dict[str, Any]:
    """The stats in the order the CLI shows them."""
    logical, stored = conn_stats["logical_bytes"], conn_stats["stored_bytes"]
    return {
        "logical_bytes": logical,
        "stored_bytes": stored,
        "physical_bytes": physical,
        "files": conn_stats["files"],
        "versions": conn_stats["versions"],
        "chunks": conn_stats["chunks"],
        "snapshots": conn_stats["snapshots"],
        "generations": conn_stats["generations"],
        "dedup_ratio": round(logical / stored, 3) if stored else 1.0,
    }
