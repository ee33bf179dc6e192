"""fsck: check every record checksum, every reference, and the space accounting.

Problems name the path, version and chunk they affect. `repair` fixes what it
can without touching committed data that is intact: a chunk whose record is
damaged is relocated to an intact copy found by scanning the log; a chunk with
no intact copy is lost, and every version that needs it is dropped (a live file
goes back to its newest intact version, or is removed if it has none). A catalog
whose index pages are damaged is rebuilt from its tables; one whose tables are
damaged is left as it is (restore it from a backup).
"""
from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import blake3

from ...errors import CorruptCatalog, CorruptData, StoreError
from ..catalog import namespace as ns
from ..catalog import xattrs
from ..catalog.db import Txn, rebuild_catalog
from ..catalog.schema import KIND_DIR, KIND_FILE, KIND_SPECIAL, KIND_SYMLINK, LIVE, ROOT_INO
from ..log.codecs import DELTA_CODECS, base_of
from ..log.device import round_up
from ..log.evicted import read_map
from ..log.layout import CATALOG_FILE, segment_path
from ..log.log import Location, location
from ..log.records import CODEC_RAW, DATA_START, RecordError, decode_segment_header, record_span, scan_records

if TYPE_CHECKING:
    from ..parts import Checking


@dataclass
class Problem:
    kind: str
    message: str
    paths: list[str] = field(default_factory=list)
    vids: list[int] = field(default_factory=list)
    chunk: str | None = None
    gens: list[int] = field(default_factory=list)  # per vid: the generation that made it current

    def line(self) -> str:
        where = []
        if self.paths:
            where.append("path " + ", ".join(self.paths))
        if self.vids and len(self.gens) == len(self.vids):
            where.append("version " + ", ".join(f"{v} (generation {g})" for v, g in zip(self.vids, self.gens)))
        elif self.vids:
            where.append("version " + ", ".join(map(str, self.vids)))
        if self.chunk:
            where.append("chunk " + self.chunk)
        return f"{self.kind}: {self.message}" + (f" ({'; '.join(where)})" if where else "")


@dataclass
class FsckReport:
    problems: list[Problem] = field(default_factory=list)
    repaired: list[str] = field(default_factory=list)
    chunks_checked: int = 0
    bytes_checked: int = 0
    segments_checked: int = 0
    segments_evicted: int = 0  # kept only in the bucket: their records are checked by `cowfs remote fsck`
    unreferenced_bytes: int = 0  # records no version uses: reclaimable by gc, not an error
    seconds: float = 0.0

    @property
    def clean(self) -> bool:
        return not self.problems


def _affected(conn: sqlite3.Connection, cid: int) -> tuple[list[str], list[int], list[int]]:
    """Paths, versions and their generations that need chunk `cid`."""
    rows = conn.execute(
        "SELECT DISTINCT v.vid, v.ino, v.birth_gen FROM versions v JOIN extents e ON e.content_id = v.content_id"
        " WHERE e.cid=? ORDER BY v.vid", (cid,)
    ).fetchall()
    paths: set[str] = set()
    for _vid, ino, _gen in rows:
        paths.update(ns.paths_of(conn, ino))
    return sorted(paths), [v for v, _, _ in rows], [g for _, _, g in rows]


def check(store: "Checking", repair: bool = False, progress: Callable[[int, int], None] | None = None) -> FsckReport:
    """Check the store; while it is mounted too (one read transaction: a consistent view of the
    catalog; records appended meanwhile lie beyond the committed ends it sees)."""
    t0 = time.monotonic()
    report = FsckReport()
    bad_chunks, intact_copies = _checked_scan(store, report, progress)
    if repair and any(p.kind == "catalog" for p in report.problems):
        if not _rebuild_catalog(store, report):
            report.seconds = time.monotonic() - t0
            return report  # nothing is changed in a store whose catalog cannot be read whole
        rescan = FsckReport()  # the rebuilt catalog, checked from the start
        bad_chunks, intact_copies = _checked_scan(store, rescan, progress)
        rescan.problems[:0] = [p for p in report.problems if p.kind == "catalog"]
        rescan.repaired = report.repaired
        report = rescan
    if repair and report.problems:
        _repair(store, report, bad_chunks, intact_copies)
    report.seconds = time.monotonic() - t0
    return report


def _checked_scan(store: "Checking", report: FsckReport, progress: Callable[[int, int], None] | None,
                  ) -> tuple[dict[int, str], dict[bytes, Location]]:
    try:
        return store.catalog.read(lambda conn: _scan(store, conn, report, progress))
    except CorruptCatalog as e:
        report.problems.append(Problem("catalog", f"{e}: the check stopped there"))
        return {}, {}


def _rebuild_catalog(store: "Checking", report: FsckReport) -> bool:
    """Copy every row into a new catalog (its indexes built afresh) and swap it in; this mends
    damaged index pages. A damaged table cannot be mended: then nothing is changed."""
    new = store.root / (CATALOG_FILE + ".rebuild")
    why = rebuild_catalog(store.catalog.path, new)
    if why is not None:
        report.problems.append(Problem("catalog", f"cannot rebuild the catalog ({why}); nothing was changed:"
                                       f" restore {CATALOG_FILE} from a backup"))
        return False
    store.replace_catalog(new)
    report.repaired.append("catalog: rebuilt from its tables (every row was readable; indexes made anew)")
    return True


def _scan(store: "Checking", conn: sqlite3.Connection, report: FsckReport, progress: Callable[[int, int], None] | None,
          ) -> tuple[dict[int, str], dict[bytes, Location]]:
    integrity = [r[0] for r in conn.execute("PRAGMA quick_check(5)")]
    if integrity != ["ok"]:
        lines = [line for msg in integrity for line in msg.splitlines() if not line.startswith("***")]
        report.problems.append(Problem("catalog", "SQLite quick_check: " + "; ".join(lines)))

    bad_chunks: dict[int, str] = {}  # cid -> why
    intact_copies: dict[bytes, Location] = {}  # hash -> an intact record of it
    segs = conn.execute("SELECT seg_id, committed_end FROM segments ORDER BY seg_id").fetchall()
    total = conn.execute("SELECT count(*) FROM chunks").fetchone()[0]
    done = 0
    for seg_id, committed_end in segs:
        rows = conn.execute(
            "SELECT cid, hash, offset, stored_len, codec, raw_len, base_cid FROM chunks WHERE seg_id=? ORDER BY offset",
            (seg_id,)).fetchall()
        path = segment_path(store.root, seg_id)
        if not path.exists() and _check_evicted(store, seg_id, rows, bad_chunks, report):
            continue
        if not path.exists():
            for cid, *_ in rows:
                bad_chunks[cid] = f"segment {seg_id} is missing"
            if rows:
                report.problems.append(Problem("segment", f"segment {seg_id} ({path.name}) is missing, {len(rows)} chunks lost"))
            continue
        report.segments_checked += 1
        seg = store.log.segment(seg_id)
        image = seg.image()
        try:
            try:
                header = decode_segment_header(bytes(image[:64]))
                if (header.seg_id, header.store_uuid) != (seg_id, store.config.store_uuid):
                    report.problems.append(Problem("segment", f"segment {seg_id}: its header names segment "
                                                   f"{header.seg_id} of store {header.store_uuid}"))
            except RecordError as e:
                report.problems.append(Problem("segment", f"segment {seg_id}: {e}"))
            records = {r.offset: r for r in scan_records(image, DATA_START)}
            for r in records.values():
                if r.header is not None and r.payload_ok:
                    intact_copies.setdefault(r.header.chunk_id, location(
                        seg_id, r.offset, r.header.stored_len, r.header.codec, r.header.raw_len))
            referenced = set()
            prev_end = 0
            for cid, h, off, n, codec, raw_len, base_cid in rows:
                h = bytes(h)
                referenced.add(off)
                rec = records.get(off)
                why = None
                if off < prev_end:
                    why = "overlaps the previous record"
                elif off + record_span(n) > round_up(max(committed_end, DATA_START)):
                    why = "lies beyond the segment's committed end"
                if rec is None or rec.header is None:
                    why = why or "no valid record header at its location"
                elif rec.header.chunk_id != h or rec.header.stored_len != n:
                    why = "record at its location holds another chunk"
                elif rec.header.codec != codec or (codec != CODEC_RAW and rec.header.raw_len != raw_len):
                    why = "record's encoding differs from the catalog's"
                elif not rec.payload_ok:
                    why = "payload checksum mismatch"
                else:
                    why = _verify(store, conn, h, location(seg_id, off, n, codec, raw_len), base_cid,
                                  image[off + 64: off + 64 + n])
                    report.bytes_checked += n
                if why:
                    bad_chunks[cid] = f"segment {seg_id} offset {off}: {why}"
                prev_end = off + 64 + n
                report.chunks_checked += 1
                done += 1
                if progress is not None and done % 256 == 0:
                    progress(done, total)
            for r in records.values():
                if r.offset not in referenced:
                    report.unreferenced_bytes += r.length
        finally:
            if image is not getattr(seg, "map", None) and hasattr(image, "close"):
                image.close()  # type: ignore[union-attr]
    if progress is not None:
        progress(total, total)

    orphans = conn.execute(
        "SELECT cid, seg_id FROM chunks WHERE seg_id NOT IN (SELECT seg_id FROM segments)"
    ).fetchall()
    for cid, seg_id in orphans:
        bad_chunks[cid] = f"segment {seg_id} is not in the catalog"

    dangling = conn.execute(
        "SELECT DISTINCT e.cid FROM extents e LEFT JOIN chunks c ON c.cid = e.cid WHERE e.cid IS NOT NULL AND c.cid IS NULL"
    ).fetchall()
    for (cid,) in dangling:
        bad_chunks[cid] = "chunk row is missing from the catalog"

    for cid, why in sorted(bad_chunks.items()):
        paths, vids, gens = _affected(conn, cid)
        h = conn.execute("SELECT hash FROM chunks WHERE cid=?", (cid,)).fetchone()
        report.problems.append(Problem("chunk", why, paths, vids, bytes(h[0]).hex()[:16] if h else f"cid {cid}", gens))

    _check_references(conn, report)
    return bad_chunks, intact_copies


def _check_evicted(store: "Checking", seg_id: int, rows: list[tuple], bad_chunks: dict[int, str],  # type: ignore[type-arg]
                   report: FsckReport) -> bool:
    """Check an evicted segment's rows against its map; False when it has no map (it is missing)."""
    try:
        emap = read_map(store.root, seg_id)
    except CorruptData as e:
        for cid, *_ in rows:
            bad_chunks[cid] = f"segment {seg_id} (evicted): {e}"
        report.problems.append(Problem("segment", f"segment {seg_id}: {e}"))
        return True
    if emap is None:
        return False
    report.segments_evicted += 1
    spans = {e.seg_offset: e.span for e in emap.entries}
    for cid, _h, off, n, *_ in rows:
        if spans.get(off) != record_span(n):
            bad_chunks[cid] = f"segment {seg_id} offset {off}: evicted, and its map does not name the record"
    return True


def _verify(store: "Checking", conn: sqlite3.Connection, h: bytes, loc: Location, base_cid: int | None,
            payload: memoryview) -> str | None:
    """Why the record's payload does not decode to chunk `h` (None when it does). A delta is
    decoded through its bases (read and decoded; each base is verified as a chunk of its own
    by the same scan, and a bad one makes this result fail its hash)."""
    if not loc.encoded:
        return None if blake3.blake3(payload).digest() == h else "content hash mismatch"
    try:
        if loc.codec in DELTA_CODECS:
            row = conn.execute("SELECT hash FROM chunks WHERE cid=?", (base_cid,)).fetchone() if base_cid else None
            if row is None or bytes(row[0]) != base_of(loc.codec, payload):
                return "a delta whose base is not in the catalog as recorded"
        raw = store.log.decode(h, loc, payload)
    except CorruptData as e:
        return f"does not decode: {e}"
    return None if blake3.blake3(raw).digest() == h else "content hash mismatch after decoding"


# extents that do not start where the previous one of their body ends (or at 0, for the first)
UNTILED = ("SELECT content_id, file_offset FROM (SELECT content_id, file_offset, lag(file_offset + length, 1, 0)"
           " OVER (PARTITION BY content_id ORDER BY file_offset) AS prev_end FROM extents) WHERE file_offset != prev_end")


def _check_references(conn: sqlite3.Connection, report: FsckReport) -> None:
    def add(kind: str, q: str, msg: str) -> None:
        for row in conn.execute(q).fetchall():
            report.problems.append(Problem(kind, msg.format(*row)))

    add("version", "SELECT v.vid, v.content_id FROM versions v LEFT JOIN contents c ON c.content_id=v.content_id"
        " WHERE v.content_id IS NOT NULL AND c.content_id IS NULL", "version {0} refers to missing body {1}")
    add("version", "SELECT v.vid, v.size, c.size FROM versions v JOIN contents c ON c.content_id=v.content_id"
        " WHERE v.size != c.size", "version {0} size {1} differs from its body's size {2}")
    add("body", "SELECT c.content_id, c.size, coalesce(sum(e.length),0) FROM contents c LEFT JOIN extents e"
        " ON e.content_id=c.content_id GROUP BY c.content_id HAVING coalesce(sum(e.length),0) != c.size",
        "body {0} size {1} differs from the sum of its extents {2}")
    for content_id, offset in conn.execute(f"SELECT content_id, min(file_offset) FROM ({UNTILED}) GROUP BY content_id"):
        rows = conn.execute("SELECT vid, ino, birth_gen FROM versions WHERE content_id=? ORDER BY vid", (content_id,)).fetchall()
        paths = sorted({p for _, ino, _ in rows for p in ns.paths_of(conn, ino)})
        report.problems.append(Problem("body", f"body {content_id} has a gap or overlap at offset {offset}: its extents"
                                       " must tile it from offset 0", paths, [r[0] for r in rows], gens=[r[2] for r in rows]))
    add("version", "SELECT v.vid, v.ino FROM versions v LEFT JOIN inodes i ON i.ino=v.ino WHERE i.ino IS NULL",
        "version {0} belongs to missing inode {1}")
    add("entry", f"SELECT d.parent, d.name, d.ino FROM dentries d WHERE d.death_gen={LIVE} AND NOT EXISTS"
        f" (SELECT 1 FROM versions v WHERE v.ino=d.ino AND v.death_gen={LIVE})",
        "live entry {1!r} in directory {0} names inode {2}, which has no live version")
    add("entry", f"SELECT d.parent, d.name FROM dentries d WHERE d.death_gen={LIVE} AND NOT EXISTS"
        f" (SELECT 1 FROM versions v WHERE v.ino=d.parent AND v.death_gen={LIVE} AND v.mode & 0xF000 = 0x4000)",
        "live entry {1!r} is in {0}, which is not a live directory")
    add("inode", f"SELECT v.ino, count(d.ino) FROM versions v LEFT JOIN dentries d ON d.ino=v.ino AND d.death_gen={LIVE}"
        f" WHERE v.death_gen={LIVE} AND v.ino != {ROOT_INO} GROUP BY v.ino"
        " HAVING count(d.ino) = 0 OR (count(d.ino) > 1 AND v.mode & 0xF000 = 0x4000)",
        "live inode {0} has {1} live names (a directory has 1, a file at least 1)")
    add("inode", f"SELECT ino, count(*) FROM versions WHERE death_gen={LIVE} GROUP BY ino HAVING count(*) > 1",
        "inode {0} has {1} live versions")
    add("inode", f"SELECT v.ino, v.nlink, {NLINK_LIVE} AS n FROM versions v WHERE v.death_gen={LIVE} AND v.nlink != n",
        "inode {0} has link count {1}, its live entries give {2}")
    add("inode", "SELECT v.vid, v.ino, i.kind, v.mode FROM versions v JOIN inodes i ON i.ino = v.ino WHERE NOT"
        f" ({KIND_MODE_MATCH})", "version {0} of inode {1} (kind {2}) has file type bits {3:o}")
    add("version", "SELECT vid, ino FROM versions WHERE content_id IS NOT NULL AND mode & 0xF000 != 0x8000",
        "version {0} of inode {1} has a body but is not a regular file")
    for vid, ino, blob in conn.execute("SELECT vid, ino, xattrs FROM versions WHERE xattrs IS NOT NULL"):
        try:
            xattrs.decode(blob)
        except ValueError as e:
            report.problems.append(Problem("version", f"version {vid} of inode {ino}: extended attributes do not decode ({e})"))
    gen = ns.current_gen(conn)
    add("snapshot", f"SELECT name, gen FROM snapshots WHERE gen > {gen}", "snapshot {0!r} pins future generation {1}")
    if conn.execute(f"SELECT 1 FROM versions WHERE ino={ROOT_INO} AND death_gen={LIVE}").fetchone() is None:
        report.problems.append(Problem("inode", "the root directory has no live version"))
    for vid, extents_ok in conn.execute(
        "SELECT v.vid, (SELECT count(*) FROM extents a JOIN extents b ON b.content_id=a.content_id"
        " AND b.file_offset = a.file_offset + a.length WHERE a.content_id=v.content_id) + 1 ="
        " (SELECT count(*) FROM extents e WHERE e.content_id=v.content_id)"
        " FROM versions v WHERE v.content_id IS NOT NULL AND v.death_gen=" + str(LIVE)
    ).fetchall():
        if not extents_ok and conn.execute(
            "SELECT count(*) FROM extents e JOIN versions v ON v.content_id=e.content_id WHERE v.vid=?", (vid,)
        ).fetchone()[0]:
            report.problems.append(Problem("version", f"version {vid} has extents that are not contiguous"))


# an inode's kind and its versions' file type bits agree (regular, directory, symlink, or one of the special types)
KIND_MODE_MATCH = (f"(i.kind = {KIND_FILE} AND v.mode & 0xF000 = 0x8000) OR (i.kind = {KIND_DIR} AND v.mode & 0xF000 = 0x4000)"
                   f" OR (i.kind = {KIND_SYMLINK} AND v.mode & 0xF000 = 0xA000) OR (i.kind = {KIND_SPECIAL}"
                   " AND v.mode & 0xF000 IN (0x1000, 0x2000, 0x6000, 0xC000))")

# what a live version's nlink must be: a directory's 2 + its live subdirectories, otherwise its live names
NLINK_LIVE = (f"(CASE WHEN v.mode & 0xF000 = 0x4000 THEN 2 + (SELECT count(*) FROM dentries d JOIN inodes i"
              f" ON i.ino = d.ino WHERE d.parent = v.ino AND d.death_gen = {LIVE} AND i.kind = {KIND_DIR})"
              f" ELSE (SELECT count(*) FROM dentries d WHERE d.ino = v.ino AND d.death_gen = {LIVE}) END)")


def _repair(store: "Checking", report: FsckReport, bad: dict[int, str], copies: dict[bytes, Location]) -> None:
    """Relocate what has an intact copy; drop every version that needs a lost chunk."""
    relocations: dict[int, Location] = {}
    bases: dict[int, bytes] = {}  # relocated deltas: cid -> their base's id
    conn = store.catalog.reader()
    for cid in bad:
        row = conn.execute("SELECT hash FROM chunks WHERE cid=?", (cid,)).fetchone()
        copy = copies.get(bytes(row[0])) if row else None
        if copy is None:
            continue
        try:
            store.log.read_chunk(copy, bytes(row[0]))  # header CRC, decoding and BLAKE3
            if copy.codec in DELTA_CODECS:
                bases[cid] = base_of(copy.codec, store.log.read_payload(copy, bytes(row[0])))  # type: ignore[assignment]
        except Exception:
            continue
        relocations[cid] = copy

    def fn(txn: Txn) -> list[str]:
        done: list[str] = []
        for cid, loc in relocations.items():
            base = txn.execute("SELECT cid FROM chunks WHERE hash=?", (bases[cid],)).fetchone() if cid in bases else None
            txn.execute("UPDATE chunks SET seg_id=?, offset=?, stored_len=?, raw_len=?, codec=?, base_cid=? WHERE cid=?",
                        (loc.seg_id, loc.offset, loc.stored_len, loc.length, loc.codec, base[0] if base else None, cid))
            txn.execute("UPDATE segments SET committed_end=max(committed_end, ?) WHERE seg_id=?", (loc.offset + loc.span, loc.seg_id))
            done.append(f"chunk cid {cid}: relocated to an intact copy in segment {loc.seg_id} offset {loc.offset}")
        for ino, n in txn.execute(f"SELECT v.ino, {NLINK_LIVE} AS n FROM versions v"
                                  f" WHERE v.death_gen={LIVE} AND v.nlink != n").fetchall():
            txn.execute("UPDATE versions SET nlink=? WHERE ino=? AND death_gen=?", (n, ino, LIVE))
            done.append(f"inode {ino}: link count set to {n}")
        lost = [cid for cid in bad if cid not in relocations]
        txn.execute("CREATE TEMP TABLE IF NOT EXISTS fsck_lost(cid INTEGER PRIMARY KEY)")
        txn.execute("DELETE FROM fsck_lost")
        txn.conn.executemany("INSERT INTO fsck_lost VALUES (?)", [(c,) for c in lost])
        # bodies that need a lost chunk, or whose extents do not add up, cannot be read whole
        broken = [r[0] for r in txn.execute(
            "SELECT DISTINCT content_id FROM extents WHERE cid IN (SELECT cid FROM fsck_lost)"
            " UNION SELECT c.content_id FROM contents c LEFT JOIN extents e ON e.content_id=c.content_id"
            " GROUP BY c.content_id HAVING coalesce(sum(e.length),0) != c.size"
            f" UNION SELECT content_id FROM ({UNTILED})"
        ).fetchall()]
        reverted: set[int] = set()
        for content_id in broken:
            for vid, ino, death in txn.execute(
                "SELECT vid, ino, death_gen FROM versions WHERE content_id=?", (content_id,)
            ).fetchall():
                paths = ", ".join(ns.paths_of(txn.conn, ino)) or f"inode {ino}"
                txn.execute("DELETE FROM versions WHERE vid=?", (vid,))
                done.append(f"{paths}: damaged version {vid} dropped")
                if death == LIVE:
                    reverted.add(ino)
            txn.execute("DELETE FROM extents WHERE content_id=?", (content_id,))
            txn.execute("DELETE FROM contents WHERE content_id=?", (content_id,))
        txn.execute("DELETE FROM chunks WHERE cid IN (SELECT cid FROM fsck_lost)")
        for ino in sorted(reverted):
            paths = ", ".join(ns.paths_of(txn.conn, ino)) or f"inode {ino}"
            prev = txn.execute("SELECT vid FROM versions WHERE ino=? ORDER BY birth_gen DESC LIMIT 1", (ino,)).fetchone()
            if prev is not None:
                txn.execute(
                    f"INSERT INTO versions({ns.VERSION_COLS}) SELECT NULL, ino, ?, ?, size, mode, uid, gid, mtime_ns,"
                    " ?, content_id, target, data_gen, nlink, atime_ns, rdev, xattrs FROM versions WHERE vid=?",
                    (txn.gen, LIVE, txn.now_ns, prev[0]),
                )
                done.append(f"{paths}: reverted to its newest intact version {prev[0]}")
            else:
                txn.execute("UPDATE dentries SET death_gen=? WHERE ino=? AND death_gen=?", (txn.gen, ino, LIVE))
                done.append(f"{paths}: no intact version left, file removed")
        return done

    try:
        report.repaired.extend(store.catalog.write(fn, op="repair"))
    except sqlite3.DatabaseError as e:
        raise StoreError(f"repair failed: {e}") from None
