"""`cowfs remote fsck`: does the bucket hold every chunk the store's retained catalog objects,
and every consumer's pinned snapshot (`pins/`), need? For each whole catalog object and the deltas after it (the catalog the newest of them
leads to: catalogs.chain_ends, materialize), every chunk some body
uses (extents, with the delta bases they decode from) must be in a pack whose index reads
back and whose object exists with the size the index gives. `deep` also reads each pack
holding such a chunk: its BLAKE3 against its name, every record (header, payload CRC), the
index against the records, and each needed chunk at the offset its index gives.

A problem names the object and the paths and versions that need what it held, found in
the catalog copy as the store's own fsck finds them (namespace.paths_of).
"""
from __future__ import annotations

import shutil
import sqlite3
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..errors import CorruptData, RemoteError
from ..store.catalog import namespace as ns
from ..store.log.records import HEADER_SIZE, RecordError, check_record
from ..store.upkeep.fsck import Problem
from .catalogs import PIN_STORE, CatalogObject, chain_ends, materialize, pin_name, pinned_catalogs, retained_catalogs
from .packs import PackIndex, decode_index, entries_of_pack, is_pack_name, pack_name
from .s3 import Bucket, MissingObject

INDEX_READERS = 8
NOWHERE = ""  # the key of the problem "in no pack"
NEEDED = ("WITH RECURSIVE keep(cid) AS (SELECT cid FROM extents WHERE cid IS NOT NULL"
          " UNION SELECT c.base_cid FROM chunks c JOIN keep k ON c.cid = k.cid WHERE c.base_cid IS NOT NULL)"
          " SELECT hash FROM chunks WHERE cid IN (SELECT cid FROM keep)")
AFFECTED = ("WITH RECURSIVE bad(cid) AS (SELECT cid FROM chunks WHERE hash IN (SELECT hash FROM s.badh)"
            " UNION SELECT c.cid FROM chunks c JOIN bad b ON c.base_cid = b.cid)"
            " SELECT DISTINCT v.vid, v.ino, v.birth_gen FROM versions v JOIN extents e ON e.content_id = v.content_id"
            " WHERE e.cid IN (SELECT cid FROM bad) ORDER BY v.vid")


@dataclass
class BucketFsckReport:
    problems: list[Problem] = field(default_factory=list)
    catalogs: list[int] = field(default_factory=list)  # generations checked
    pins: list[str] = field(default_factory=list)  # consumers' pinned snapshots checked (pins/NAME.db.zst)
    packs: int = 0  # pack objects listed
    indexes: int = 0  # indexes read
    orphans: int = 0  # packs without an index (a pass adopts them, a remote gc deletes unused ones)
    chunks_checked: int = 0  # distinct chunks the catalogs' bodies need
    packs_read: int = 0  # deep: packs read whole
    bytes_read: int = 0
    seconds: float = 0.0

    @property
    def clean(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, object]:
        return {"clean": self.clean, "problems": [p.line() for p in self.problems], "catalogs": self.catalogs,
                "pins": self.pins, "packs": self.packs, "indexes": self.indexes, "orphan_packs": self.orphans,
                "chunks_checked": self.chunks_checked, "packs_read": self.packs_read, "bytes_read": self.bytes_read,
                "seconds": round(self.seconds, 3)}


class _Check:
    def __init__(self, bucket: Bucket, work: Path, report: BucketFsckReport) -> None:
        self.bucket, self.work, self.report = bucket, work, report
        self.db = sqlite3.connect(work / "fsck.db", isolation_level=None)
        self.db.executescript(
            "PRAGMA journal_mode=OFF;"
            "CREATE TABLE loc (hash BLOB, pack TEXT, offset INTEGER, stored_len INTEGER, PRIMARY KEY (hash, pack))"
            " WITHOUT ROWID;"
            "CREATE TABLE need (hash BLOB PRIMARY KEY) WITHOUT ROWID;"
            "CREATE TABLE badh (hash BLOB PRIMARY KEY) WITHOUT ROWID;")
        self.bad: dict[str, str] = {}  # pack -> why none of its chunks can be read from it
        self.sizes: dict[str, int] = {}  # pack -> size its index gives

    def indexes(self) -> None:
        prefix = self.bucket.key("index", "")
        names = [o.key[len(prefix):] for o in self.bucket.list(prefix) if is_pack_name(o.key[len(prefix):])]
        pprefix = self.bucket.key("packs", "")
        stored = {o.key[len(pprefix):]: o.size for o in self.bucket.list(pprefix)}
        self.report.packs = len(stored)
        self.report.orphans = len(set(stored) - set(names))

        def read(name: str) -> tuple[str, PackIndex | str | None]:
            try:
                return name, decode_index(self.bucket.get(self.bucket.key("index", name)), expect_name=name)
            except MissingObject:
                return name, None  # deleted since the listing (a remote gc)
            except CorruptData as e:
                return name, str(e)

        with ThreadPoolExecutor(INDEX_READERS) as pool:
            for name, idx in pool.map(read, names):
                if idx is None:
                    continue
                if isinstance(idx, str):
                    self.report.problems.append(Problem("index", f"index/{name}: {idx}; what its pack holds is unknown"))
                    continue
                self.report.indexes += 1
                self.sizes[name] = idx.size
                self.db.executemany("INSERT OR IGNORE INTO loc VALUES (?, ?, ?, ?)",
                                    [(e.chunk_id, name, e.offset, e.stored_len) for e in idx.entries])
                if name not in stored:
                    self.bad[name] = f"packs/{name}: missing from the bucket"
                elif stored[name] != idx.size:
                    self.bad[name] = f"packs/{name}: {stored[name]} bytes, its index says {idx.size}"

    def needed(self, copy: Path) -> None:
        conn = sqlite3.connect(copy)
        try:
            self.db.executemany("INSERT OR IGNORE INTO need VALUES (?)", conn.execute(NEEDED))
        finally:
            conn.close()

    def deep(self, progress: Callable[[int, int], None] | None) -> None:
        packs = [str(p) for (p,) in self.db.execute(
            "SELECT DISTINCT l.pack FROM loc l JOIN need n ON n.hash = l.hash ORDER BY l.pack") if p not in self.bad]
        total = sum(self.sizes[p] for p in packs)
        for name in packs:
            try:
                data = self.bucket.get(self.bucket.key("packs", name))
            except MissingObject:
                self.bad[name] = f"packs/{name}: missing from the bucket"
                continue
            self.report.packs_read += 1
            self.report.bytes_read += len(data)
            why = self._verify(name, data)
            if why:
                self.bad[name] = f"packs/{name}: {why}"
            if progress is not None:
                progress(self.report.bytes_read, total)

    def _verify(self, name: str, data: bytes) -> str | None:
        """Why the pack is damaged (None: it is not). A pack whose needed records all check out
        but whose bytes do not hash to its name still counts as damaged."""
        bad_records = []
        for h, offset, stored_len in self.db.execute(
                "SELECT l.hash, l.offset, l.stored_len FROM loc l JOIN need n ON n.hash = l.hash WHERE l.pack = ?",
                (name,)).fetchall():
            view = memoryview(data)[offset:offset + HEADER_SIZE + stored_len]
            try:
                check_record(view, bytes(h), stored_len)
            except RecordError as e:
                bad_records.append(f"chunk {bytes(h).hex()[:16]} at offset {offset}: {e}")
        if bad_records:
            return f"{len(bad_records)} damaged records ({bad_records[0]})"
        if pack_name(data) != name:
            return "its bytes do not hash to its name"
        try:
            entries_of_pack(data)
        except CorruptData as e:
            return str(e)
        return None

    def unreadable(self) -> dict[str, list[bytes]]:
        """The needed chunks no good pack holds, by the bad pack holding them (NOWHERE: none)."""
        bad = sorted(self.bad)
        groups: dict[str, list[bytes]] = {}
        rows = self.db.execute(
            "SELECT n.hash, (SELECT min(l.pack) FROM loc l WHERE l.hash = n.hash) FROM need n WHERE NOT EXISTS"
            " (SELECT 1 FROM loc l WHERE l.hash = n.hash AND l.pack NOT IN (%s))" % ",".join("?" * len(bad)), bad)
        for h, pack in rows:
            groups.setdefault(pack or NOWHERE, []).append(bytes(h))
        return groups

    def needed_in(self, pack: str) -> int:
        return int(self.db.execute("SELECT count(*) FROM loc l JOIN need n ON n.hash = l.hash WHERE l.pack = ?",
                                   (pack,)).fetchone()[0])

    def affected(self, cat: CatalogObject, copy: Path, hashes: list[bytes], found: "_Found") -> None:
        """Add the paths and versions of the catalog copy that need `hashes` (directly or as
        delta bases) to `found`."""
        self.db.execute("DELETE FROM badh")
        self.db.executemany("INSERT INTO badh VALUES (?)", [(h,) for h in hashes])
        conn = sqlite3.connect(copy)
        try:
            conn.execute("ATTACH DATABASE ? AS s", (str(self.work / "fsck.db"),))
            if conn.execute("SELECT 1 FROM chunks WHERE hash IN (SELECT hash FROM s.badh) LIMIT 1").fetchone():
                if cat.store_uuid == PIN_STORE:
                    found.pins.add(pin_name(cat.key))
                else:
                    found.catalogs.add(cat.generation)
            for vid, ino, gen in conn.execute(AFFECTED).fetchall():
                if vid not in found.problem.vids:
                    found.problem.vids.append(vid)
                    found.problem.gens.append(gen)
                found.paths.update(ns.paths_of(conn, ino))
        finally:
            conn.close()


@dataclass
class _Found:
    problem: Problem
    needed: int = 0  # chunks the catalogs need that the pack holds
    chunks: set[bytes] = field(default_factory=set)
    paths: set[str] = field(default_factory=set)
    catalogs: set[int] = field(default_factory=set)
    pins: set[str] = field(default_factory=set)

    def finish(self, orphans: int) -> Problem:
        p = self.problem
        if not p.message:  # NOWHERE
            p.message = f"{len(self.chunks)} chunks the catalogs use are in no readable pack of the bucket" + (
                f" ({orphans} packs have no index: a pass adopts them)" if orphans else "")
        elif self.chunks:
            p.message += f"; it held {len(self.chunks)} chunks the catalogs use"
        elif self.needed:
            p.message += f"; the {self.needed} chunks the catalogs use from it are in other packs too"
        else:
            p.message += "; the catalogs use none of its chunks"
        if self.catalogs:
            p.message += " (catalog generation " + ", ".join(map(str, sorted(self.catalogs))) + ")"
        if self.pins:
            p.message += " (pinned snapshot " + ", ".join(sorted(self.pins)) + ")"
        p.paths = sorted(self.paths)
        return p


def check(bucket: Bucket, store_uuid: str, tmpdir: Path, deep: bool = False,
          progress: Callable[[int, int], None] | None = None) -> BucketFsckReport:
    t0 = time.monotonic()
    report = BucketFsckReport()
    tmpdir.mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="remote-fsck-", dir=tmpdir))
    try:
        chk = _Check(bucket, work, report)
        chk.indexes()
        copies: list[tuple[CatalogObject, Path]] = []

        def load(chain: list[CatalogObject], copy: Path) -> bool:
            cat = chain[-1]
            try:
                if not materialize(bucket, chain, copy):
                    return False  # replaced by a newer one (or unpinned) since the listing
            except RemoteError as e:
                report.problems.append(Problem("catalog", f"{cat.key}: {e}" if cat.key not in str(e) else str(e)))
                return False
            chk.needed(copy)
            copies.append((cat, copy))
            return True

        for chain in chain_ends(retained_catalogs(bucket, store_uuid)):
            if load(chain, work / f"catalog-{chain[-1].generation}.db"):
                report.catalogs.append(chain[-1].generation)
        for cat in pinned_catalogs(bucket):  # every consumer's pin in the prefix: remote gc keeps what they need
            if load([cat], work / f"pin-{len(report.pins)}.db"):
                report.pins.append(pin_name(cat.key))
        if not report.catalogs and not report.problems:
            report.problems.append(Problem("catalog", f"{bucket.where}: store {store_uuid} has no catalog object "
                                           "(cowfs remote push uploads one)"))
        report.chunks_checked = int(chk.db.execute("SELECT count(*) FROM need").fetchone()[0])
        if deep:
            chk.deep(progress)
        found = {name: _Found(Problem("pack", why), chk.needed_in(name)) for name, why in sorted(chk.bad.items())}
        for key, hashes in chk.unreadable().items():
            f = found.setdefault(key, _Found(Problem("chunk", "")))
            f.chunks.update(hashes)
            for cat, copy in copies:
                chk.affected(cat, copy, hashes, f)
        report.problems += [f.finish(report.orphans) for f in found.values()]
        chk.db.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report.seconds = time.monotonic() - t0
    return report
