"""The lineage index and the delta policy.

The index keeps, for each tensor piece (tensor name, dtype, shape; piece k), the piece each
compacted body had, by the body's generation, so a checkpoint's piece k of a tensor finds
the same piece of the checkpoints just before and after it wherever the files live (a new
`checkpoint-N/` directory, a new Lightning file name, the same path rewritten), whatever
order the bodies are compacted in.

Policy (docs/design.md, "Compaction"): reverse deltas. The newest piece of a lineage is
stored whole (raw); an older piece Q is a delta against the next newer distinct piece P,
unless that would make some read touch more than the store's read chain (StoreConfig.read_chain,
at most MAX_CHAIN) records: the chain of deltas already leaning on Q (its height), Q itself
and P's own records must fit. So with a read chain of N every N-th piece of a lineage stays
whole (a keyframe), older checkpoints read through at most N records per piece, and the
newest reads one.
"""
from __future__ import annotations

import sqlite3

import blake3

from ..catalog.db import Txn
from ..log.layout import MAX_CHAIN


def tensor_key(name: str, dtype: str, shape: tuple[int, ...] | None) -> bytes:
    text = f"{name}\0{dtype}\0{'?' if shape is None else ','.join(map(str, shape))}"
    return blake3.blake3(text.encode()).digest()[:16]


def newer(conn: sqlite3.Connection, key: bytes, piece: int, gen: int) -> tuple[int, int] | None:
    """(generation, chunks.cid) of the piece of the nearest body after generation `gen`."""
    row = conn.execute("SELECT gen, cid FROM lineage WHERE tensor_key=? AND piece=? AND gen>? ORDER BY gen LIMIT 1",
                       (key, piece, gen)).fetchone()
    return None if row is None else (int(row[0]), int(row[1]))


def older(conn: sqlite3.Connection, key: bytes, piece: int, gen: int) -> tuple[int, int] | None:
    """(generation, chunks.cid) of the piece of the nearest body before generation `gen`."""
    row = conn.execute("SELECT gen, cid FROM lineage WHERE tensor_key=? AND piece=? AND gen<?"
                       " ORDER BY gen DESC LIMIT 1", (key, piece, gen)).fetchone()
    return None if row is None else (int(row[0]), int(row[1]))


def record(txn: Txn, rows: list[tuple[bytes, int, int, int]]) -> None:
    """(tensor key, piece, body generation, cid) rows of a compacted body."""
    txn.conn.executemany("INSERT OR REPLACE INTO lineage(tensor_key, piece, gen, cid) VALUES (?,?,?,?)", rows)


def height(conn: sqlite3.Connection, cid: int) -> int:
    """How many deltas lean on chunk `cid` in the longest chain (0: none)."""
    row = conn.execute(
        "WITH RECURSIVE up(cid, h) AS (SELECT ?, 0 UNION ALL SELECT c.cid, up.h + 1 FROM chunks c"
        " JOIN up ON c.base_cid = up.cid WHERE up.h < ?) SELECT max(h) FROM up", (cid, MAX_CHAIN + 1)).fetchone()
    return int(row[0] or 0)


def chain(conn: sqlite3.Connection, cid: int) -> list[int]:
    """The chunk and the bases it decodes through, itself first (at most MAX_CHAIN + 1)."""
    out = [cid]
    while len(out) <= MAX_CHAIN:
        row = conn.execute("SELECT base_cid FROM chunks WHERE cid=?", (out[-1],)).fetchone()
        if row is None or row[0] is None:
            break
        out.append(int(row[0]))
    return out


def may_lean_on(conn: sqlite3.Connection, q: int, p_chain: list[int], bound: int = MAX_CHAIN) -> bool:
    """Whether chunk q may become a delta against the chunk whose decoding chain is `p_chain`
    (its records, itself first): no read would touch more than `bound` records (the store's
    read chain, at most MAX_CHAIN), and no cycle would form."""
    return q not in p_chain and height(conn, q) + 1 + len(p_chain) <= bound


def forget_dead_pieces(txn: Txn) -> None:
    """After gc deleted chunks: lineage rows whose newest piece is gone go."""
    txn.execute("DELETE FROM lineage WHERE cid NOT IN (SELECT cid FROM chunks)")
