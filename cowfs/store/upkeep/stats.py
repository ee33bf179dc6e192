"""What `cowfs stats` reports: logical bytes (every version's size, each body once per
file), unique bytes (distinct chunks, decoded), stored bytes (their record payloads as
encoded), physical bytes (blocks the segment files use), and the same per codec."""
from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from ..catalog import namespace as ns
from ..catalog.schema import LIVE
from ..log.codecs import CODEC_NAMES
from ..log.layout import SEGMENTS_DIR


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
    unique, stored, chunks = conn.execute(
        "SELECT coalesce(sum(raw_len), 0), coalesce(sum(stored_len), 0), count(*) FROM chunks").fetchone()
    by_codec = {CODEC_NAMES.get(codec, str(codec)): {"chunks": n, "unique_bytes": u, "stored_bytes": st}
                for codec, n, u, st in conn.execute(
                    "SELECT codec, count(*), sum(raw_len), sum(stored_len) FROM chunks GROUP BY codec ORDER BY codec")}
    pending = conn.execute("SELECT count(*), coalesce(sum(size), 0) FROM contents WHERE compacted = 0"
                           " AND content_id IN (SELECT content_id FROM versions)").fetchone()
    files = conn.execute(
        "SELECT count(*) FROM versions WHERE death_gen=? AND mode & 0xF000 = 0x8000", (LIVE,)
    ).fetchone()[0]
    snaps = conn.execute("SELECT count(*) FROM snapshots").fetchone()[0]
    return {"logical_bytes": logical, "unique_bytes": unique, "stored_bytes": stored, "files": files,
            "versions": versions, "chunks": chunks, "snapshots": snaps, "generations": ns.current_gen(conn),
            "codecs": by_codec, "uncompacted_bodies": pending[0], "uncompacted_bytes": pending[1]}


def report(conn_stats: dict[str, Any], physical: int) -> dict[str, Any]:
    """The stats in the order the CLI shows them."""
    logical, stored = conn_stats["logical_bytes"], conn_stats["stored_bytes"]
    return {
        "logical_bytes": logical,
        "unique_bytes": conn_stats["unique_bytes"],
        "stored_bytes": stored,
        "physical_bytes": physical,
        "files": conn_stats["files"],
        "versions": conn_stats["versions"],
        "chunks": conn_stats["chunks"],
        "snapshots": conn_stats["snapshots"],
        "generations": conn_stats["generations"],
        "dedup_ratio": round(logical / conn_stats["unique_bytes"], 3) if conn_stats["unique_bytes"] else 1.0,
        "stored_ratio": round(stored / logical, 3) if logical else 1.0,
        "uncompacted_bodies": conn_stats["uncompacted_bodies"],
        "uncompacted_bytes": conn_stats["uncompacted_bytes"],
        "codecs": conn_stats["codecs"],
    }
