"""What the remote tests share: a bucket's listing, waiting for objects to age on the
engine's clock, a store's files read back from the bucket alone (newest catalog object,
the indexes, ranged GETs of the packs), and a store with a remote made and written to."""
from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from cowfs.remote.config import RemoteConfig
from cowfs.remote.doomed import CLOCK_STEP
from cowfs.remote.fetch import RemoteChunks
from cowfs.remote.packs import decode_index
from cowfs.remote.s3 import Bucket
from cowfs.remote.state import RemoteState
from cowfs.remote.catalogs import chain_to, materialize, retained_catalogs
from cowfs.remote.tier import tier_of
from cowfs.store import ROOT_INO, Store
from tests.support.storeutil import new_store


def bucket_objects(cfg: RemoteConfig) -> dict[str, int]:
    b = Bucket(cfg)
    return {o.key: o.size for o in b.list(b.key(""))}


def pack_names(cfg: RemoteConfig) -> set[str]:
    """The names of the pack objects in the bucket."""
    b = Bucket(cfg)
    prefix = b.key("packs", "")
    return {o.key[len(prefix):] for o in b.list(prefix)}


def wait_older(cfg: RemoteConfig, kind: str, seconds: float, deadline: float = 120.0) -> None:
    """Until every object under PREFIX/kind/ is `seconds` old on the engine's clock (its Date
    against their LastModified, whole seconds allowed for, as remote gc measures)."""
    b = Bucket(cfg)
    end = time.monotonic() + deadline
    while True:
        now = b.clock()
        if all(now - o.modified >= seconds + CLOCK_STEP for o in b.list(b.key(kind, ""))):
            return
        assert time.monotonic() < end, f"{kind}/ objects not {seconds} s old within {deadline} s"
        time.sleep(0.2)


def read_back(cfg: RemoteConfig, store_uuid: str, tmp: Path, directory: bytes = b"run") -> dict[str, bytes]:
    """Every live file's bytes, rebuilt from the bucket alone: the newest catalog object,
    the indexes, ranged GETs of the packs."""
    bucket = Bucket(cfg)
    cats = retained_catalogs(bucket, store_uuid)
    chain = chain_to(cats, cats[-1].generation, set())
    assert chain is not None, "no whole catalog leads to the newest generation"
    db = tmp / "fetched.db"
    db.unlink(missing_ok=True)
    assert materialize(bucket, chain, db)
    for stale in tmp.glob("fetched-remote.db*"):  # what an earlier call learnt may be gone from the bucket
        stale.unlink()
    state = RemoteState(tmp / "fetched-remote.db", cfg.url)
    for obj in bucket.list(bucket.key("index", "")):
        idx = decode_index(bucket.get(obj.key))
        state.add_pack(idx.name, idx.size, idx.entries, mine=False)
    chunks = RemoteChunks(bucket, state)
    conn = sqlite3.connect(db)
    (gen,) = conn.execute("SELECT value FROM meta WHERE key='generation'").fetchone()
    out: dict[str, bytes] = {}
    (parent,) = conn.execute("SELECT ino FROM dentries WHERE parent = 1 AND name = ? AND death_gen > ?",
                             (directory, gen)).fetchone()
    rows = conn.execute("SELECT v.content_id, d.name FROM dentries d JOIN versions v ON v.ino = d.ino"
                        " WHERE d.death_gen > ? AND v.death_gen > ? AND v.birth_gen <= ? AND v.content_id IS NOT NULL"
                        " AND d.parent = ?", (gen, gen, gen, parent)).fetchall()
    for content_id, name in rows:
        parts = []
        for length, h in conn.execute("SELECT e.length, c.hash FROM extents e LEFT JOIN chunks c ON c.cid = e.cid"
                                      " WHERE e.content_id = ? ORDER BY e.file_offset", (content_id,)):
            parts.append(bytes(length) if h is None else bytes(chunks.read(bytes(h))))
        out[f"/{directory.decode()}/" + bytes(name).decode()] = b"".join(parts)
    conn.close()
    state.close()
    return out


def configure(store: Store, rgw, bucket: str, prefix: str = "p") -> RemoteConfig:  # type: ignore[no-untyped-def]
    cfg = RemoteConfig(f"s3://{bucket}/{prefix}", endpoint=rgw.credentials.endpoint)
    tier_of(store).set(cfg)
    return cfg


def put_file(s: Store, name: str, blob: bytes) -> set[str]:
    """Write /run/NAME, push; returns the packs that push added."""
    cfg = tier_of(s).config
    assert cfg is not None
    before = pack_names(cfg)
    s.write_file(f"/run/{name}", blob)
    tier_of(s).push()
    return pack_names(cfg) - before


def delete_pack(cfg: RemoteConfig, name: str) -> None:
    """What a sweep does to a pack: its index, then its object."""
    b = Bucket(cfg)
    b.delete([b.key("index", name)])
    b.delete([b.key("packs", name)])


def one_store(tmp_path: Path, rgw, s3_bucket, name: str = "s",  # type: ignore[no-untyped-def]
              prefix: str = "p") -> tuple[Store, RemoteConfig]:
    s = Store.open(new_store(tmp_path / name))
    s.mkdir(ROOT_INO, b"run")
    return s, configure(s, rgw, s3_bucket.name, prefix)
