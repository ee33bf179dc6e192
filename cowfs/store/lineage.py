"""The lineage index: for each tensor piece (tensor name, dtype, shape; piece k), the newest
piece the compactor has seen, the one before it and the newest keyframe, so the next
checkpoint's piece k of the same tensor finds its base wherever the file lives (a new
`checkpoint-N/` directory, a new Lightning file name, the same path rewritten).

Delta policy (docs/design.md, "Compaction"): the newest piece of a lineage is stored
whole. When a newer distinct piece arrives, the one it supersedes becomes a delta against
the lineage's keyframe, unless it is itself a keyframe (every KEYFRAME_EVERY-th distinct
piece is). So every delta's base is a whole record: a read touches at most 2 records per
piece, and no delta ever has to be re-encoded when its base ages.
"""
from __future__ import annotations

import sqlite3
from dataclasses import dataclass

import blake3

from .catalog import Txn

KEYFRAME_EVERY = 4  # one whole piece in every 4 distinct pieces of a lineage


def tensor_key(name: str, dtype: str, shape: tuple[int, ...] | None) -> bytes:
    text = f"{name}\0{dtype}\0{'?' if shape is None else ','.join(map(str, shape))}"
    return blake3.blake3(text.encode()).digest()[:16]


@dataclass(frozen=True)
class LineageRow:
    cid: int
    prev_cid: int | None
    keyframe: int | None
    seq: int


def lookup(conn: sqlite3.Connection, key: bytes, piece: int) -> LineageRow | None:
    row = conn.execute("SELECT cid, prev_cid, keyframe, seq FROM lineage WHERE tensor_key=? AND piece=?",
                       (key, piece)).fetchone()
    return None if row is None else LineageRow(*row)


def advance(txn: Txn, key: bytes, piece: int, cid: int, old: LineageRow | None) -> None:
    """Record `cid` as the newest piece (a distinct one: the caller checked cid != old.cid)."""
    seq = 0 if old is None else old.seq + 1
    if seq % KEYFRAME_EVERY == 0 or old is None:
        keyframe: int | None = cid
    elif old.keyframe is None:  # the keyframe is gone: the superseded piece stayed whole, it takes over
        keyframe = old.cid
    else:
        keyframe = old.keyframe
    txn.execute("INSERT OR REPLACE INTO lineage(tensor_key, piece, cid, prev_cid, keyframe, seq) VALUES (?,?,?,?,?,?)",
                (key, piece, cid, None if old is None else old.cid, keyframe, seq))


def delta_base(old: LineageRow) -> int | None:
    """The base the superseded piece `old.cid` should become a delta against, or None when it
    stays whole (it is the keyframe, or the keyframe is gone)."""
    if old.keyframe is None or old.keyframe == old.cid or old.seq % KEYFRAME_EVERY == 0:
        return None
    return old.keyframe


def forget_dead_pieces(txn: Txn) -> None:
    """After gc deleted chunks: lineage rows whose newest piece is gone go; a gone keyframe or
    previous piece is forgotten (the next superseded piece then stays whole)."""
    txn.execute("DELETE FROM lineage WHERE cid NOT IN (SELECT cid FROM chunks)")
    txn.execute("UPDATE lineage SET keyframe=NULL WHERE keyframe IS NOT NULL AND keyframe NOT IN (SELECT cid FROM chunks)")
    txn.execute("UPDATE lineage SET prev_cid=NULL WHERE prev_cid IS NOT NULL AND prev_cid NOT IN (SELECT cid FROM chunks)")
