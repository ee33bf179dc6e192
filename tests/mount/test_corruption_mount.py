"""Corruption (issue 5): a store holding torch and safetensors checkpoints, several versions
of each and a snapshot after every round, is damaged while unmounted: bytes of a chunk's
payload and of a record header, a truncated segment, a deleted segment, and the catalog
(index pages, table pages, rows that still parse, a file that is no database at all).

Mounted, a damaged version fails to read with EIO, never with wrong bytes; every other
version reads byte-identical; the daemon log names the path and version of each bad read.
`cowfs fsck` exits 1 and names every affected path and version; `cowfs fsck --repair`
leaves a store that mounts, fscks clean, and still holds every undamaged version, live
and in snapshots, byte for byte. A catalog that cannot be read at all makes every command
fail with one line, and changes nothing.
"""
from __future__ import annotations

import errno
import hashlib
import io
import os
import random
import shutil
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import pytest
import safetensors.torch
import torch

from cowfs.mountinfo import mounted_cowfs
from cowfs.store import ROOT_INO, Store
from cowfs.store.log.layout import segment_path
from tests.support.mountutil import cowfs, mounted
from tests.support.storeutil import assert_clean

pytestmark = [pytest.mark.mount, pytest.mark.damaged]

# path -> (format, number of floats): ~0.4 to 1.6 MB per version, three rounds: three 4 MiB segments
FILES = {
    "/run/model.pt": ("pt", 200_000),
    "/run/optim.pt": ("pt", 400_000),
    "/run/model.safetensors": ("safetensors", 200_000),
    "/other/model.safetensors": ("safetensors", 100_000),
    "/run/config.json": ("json", 0),
}
ROUNDS = 3


def checkpoint(kind: str, n: int, seed: int) -> bytes:
    if kind == "json":
        return b'{"step": %d}\n' % seed
    g = torch.Generator().manual_seed(seed)
    sd = {"weight": torch.randn(n + seed % 1000, generator=g), "bias": torch.randn(64, generator=g)}
    if kind == "pt":
        buf = io.BytesIO()
        torch.save(sd, buf)
        return buf.getvalue()
    return safetensors.torch.save(sd)


@dataclass(frozen=True)
class Version:
    vid: int
    ino: int
    gen: int  # the generation that made it current
    content_id: int | None


@dataclass
class Truth:
    """What the pristine store holds, read through the engine before any damage."""

    views: dict[tuple[str | None, str], int] = field(default_factory=dict)  # (snapshot or None, path) -> vid
    data: dict[int, bytes] = field(default_factory=dict)  # vid -> bytes, for every version a view shows
    versions: dict[int, Version] = field(default_factory=dict)  # every file version in the catalog
    chunks: dict[int, tuple[int, int, int]] = field(default_factory=dict)  # cid -> (segment, offset, stored_len)
    users: dict[int, set[int]] = field(default_factory=dict)  # cid -> vids whose body needs it

    def path_of(self, vid: int) -> str:
        return next(p for (_, p), v in self.views.items() if v == vid)

    def needing(self, cids: set[int]) -> set[int]:
        return {vid for cid in cids for vid in self.users.get(cid, set())}

    def chunks_of(self, path: str, view: str | None) -> set[int]:
        vid = self.views[(view, path)]
        return {cid for cid, users in self.users.items() if vid in users}

    def only_in(self, path: str, view: str | None) -> list[int]:
        """Chunks of that version that no other file needs (sorted by location)."""
        ino = self.versions[self.views[(view, path)]].ino
        own = [c for c in self.chunks_of(path, view) if all(self.versions[v].ino == ino for v in self.users[c])]
        return sorted(own, key=lambda c: self.chunks[c][:2])

    def after_repair(self, vid: int, bad: set[int]) -> bytes:
        """What the live file reads once repair dropped its damaged versions: its newest intact one."""
        ino = self.versions[vid].ino
        for v in sorted((v for v in self.versions.values() if v.ino == ino), key=lambda v: -v.gen):
            if v.vid not in bad:
                assert v.vid in self.data or v.content_id is None
                return self.data.get(v.vid, b"")
        raise AssertionError(f"inode {ino} has no version left")


def _walk(s: Store, gen: int | None, ino: int = ROOT_INO, prefix: str = "") -> Iterator[tuple[str, int, int]]:
    for name, attr in s.readdir(ino, gen):
        path = f"{prefix}/{name.decode()}"
        if attr.is_dir:
            yield from _walk(s, gen, attr.ino, path)
        else:
            yield path, attr.ino, attr.vid


def build(path: Path) -> Truth:
    Store.init(path, segment_size=4 << 20)
    with Store.open(path) as s:
        s.mkdir(ROOT_INO, b"run")
        s.mkdir(ROOT_INO, b"other")
        for r in range(ROUNDS):
            for i, (name, (kind, n)) in enumerate(FILES.items()):
                s.write_file(name, checkpoint(kind, n, 100 * i + r))
            s.snapshot_create(f"round-{r}")
        truth = Truth()
        for view in [None] + [snap.name for snap in s.snapshot_list()]:
            gen = None if view is None else s.snapshot(view).gen
            for p, _ino, vid in _walk(s, gen):
                truth.views[(view, p)] = vid
                truth.data.setdefault(vid, s.read_file(p, gen))
        conn = s.catalog.reader()
        for vid, ino, gen, content_id in conn.execute(
                "SELECT vid, ino, birth_gen, content_id FROM versions WHERE mode & 0xF000 = 0x8000"):
            truth.versions[vid] = Version(vid, ino, gen, content_id)
        for cid, seg, off, n in conn.execute("SELECT cid, seg_id, offset, stored_len FROM chunks"):
            truth.chunks[cid] = (seg, off, n)
        for cid, vid in conn.execute("SELECT DISTINCT e.cid, v.vid FROM extents e JOIN versions v"
                                     " ON v.content_id = e.content_id WHERE e.cid IS NOT NULL"):
            truth.users.setdefault(cid, set()).add(vid)
    assert len({seg for seg, _, _ in truth.chunks.values()}) >= 3
    return truth


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Truth]:
    path = tmp_path_factory.mktemp("pristine") / "store"
    truth = build(path)
    return path, truth


@pytest.fixture
def damaged(pristine: tuple[Path, Truth], tmp_path: Path) -> tuple[Path, Truth]:
    """A copy of the pristine store, to be damaged by the test."""
    src, truth = pristine
    dst = tmp_path / "store"
    shutil.copytree(src, dst)
    return dst, truth


def flip(path: Path, offset: int, n: int = 1) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        old = f.read(n)
        f.seek(offset)
        f.write(bytes(b ^ 0xFF for b in old))


def view_path(m: Path, view: str | None, path: str) -> Path:
    return m / path.lstrip("/") if view is None else m / ".snapshots" / view / path.lstrip("/")


def checksums(store: Path) -> dict[str, str]:
    return {str(p.relative_to(store)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(store.rglob("*")) if p.is_file()}


def read_all(m: Path, truth: Truth, bad: set[int]) -> None:
    """Damaged versions fail with EIO; every other version reads byte-identical."""
    for (view, path), vid in truth.views.items():
        f = view_path(m, view, path)
        if vid in bad:
            with pytest.raises(OSError) as e:
                f.read_bytes()
            assert e.value.errno == errno.EIO, f"{view}:{path}"
        else:
            assert f.read_bytes() == truth.data[vid], f"{view}:{path} changed"


def assert_logged(store: Path, truth: Truth, bad: set[int]) -> None:
    """The daemon log names the path and version (generation) of every damaged version read."""
    lines = [line for line in (store / "cowfs.log").read_text().splitlines() if "corrupt data" in line]
    for vid in bad & set(truth.views.values()):
        v = truth.versions[vid]
        want = f"version {vid} (generation {v.gen})"
        assert any(truth.path_of(vid) in line and want in line for line in lines), (want, lines)
    assert len(lines) <= 2 * len(truth.views), "one line per bad read, not one per retry of the kernel"


def assert_fsck_names(store: Path, truth: Truth, bad: set[int]) -> str:
    r = cowfs("fsck", str(store), check=False)
    out = r.stdout.decode()
    assert r.returncode == 1, out + r.stderr.decode()
    for vid in bad:
        v = truth.versions[vid]
        assert f"{vid} (generation {v.gen})" in out, (vid, out)
        if vid in truth.views.values():
            assert truth.path_of(vid) in out, (truth.path_of(vid), out)
    return out


def repair_and_check(store: Path, mnt: Path, truth: Truth, bad: set[int]) -> None:
    r = cowfs("fsck", str(store), "--repair", check=False)
    assert r.returncode == 0, r.stdout.decode() + r.stderr.decode()
    r = cowfs("fsck", str(store), check=False)
    assert r.returncode == 0, r.stdout.decode()
    before = {vid: hashlib.sha256(b).hexdigest() for vid, b in truth.data.items() if vid not in bad}
    with mounted(store, mnt) as m:
        for (view, path), vid in truth.views.items():
            f = view_path(m, view, path)
            if vid not in bad:
                assert hashlib.sha256(f.read_bytes()).hexdigest() == before[vid], f"{view}:{path} changed"
            elif view is None:  # back at its newest intact version
                assert f.read_bytes() == truth.after_repair(vid, bad), path
            else:  # that version is gone from the snapshot, which still lists everything else
                assert not f.exists() and f.name not in os.listdir(f.parent), f"{view}:{path}"
    assert_clean(store)


def check_damage(store: Path, tmp_path: Path, truth: Truth, bad_chunks: set[int]) -> None:
    bad = truth.needing(bad_chunks)
    assert bad and len(bad) < len(truth.versions)
    with mounted(store, tmp_path / "mnt") as m:
        read_all(m, truth, bad)
    assert_logged(store, truth, bad)
    assert_fsck_names(store, truth, bad)
    repair_and_check(store, tmp_path / "mnt", truth, bad)


# -- damaged segments ------------------------------------------------------------------------


def test_flipped_payload_and_header_bytes(damaged, tmp_path):
    store, truth = damaged
    payload = truth.only_in("/run/model.pt", "round-1")[1]
    seg, off, n = truth.chunks[payload]
    flip(segment_path(store, seg), off + 64 + n // 2, 3)
    header = truth.only_in("/run/model.safetensors", None)[0]
    seg, off, n = truth.chunks[header]
    flip(segment_path(store, seg), off + 20)  # inside the chunk id: the header CRC fails
    bad = truth.needing({payload, header})
    assert {truth.versions[v].ino for v in bad} == {truth.versions[truth.views[(None, p)]].ino
                                                    for p in ("/run/model.pt", "/run/model.safetensors")}
    check_damage(store, tmp_path, truth, {payload, header})


def test_truncated_segment(damaged, tmp_path):
    store, truth = damaged
    seg = sorted({s for s, _, _ in truth.chunks.values()})[1]
    in_seg = sorted((off, n, cid) for cid, (s, off, n) in truth.chunks.items() if s == seg)
    off, _, _ = in_seg[len(in_seg) // 2]
    cut = off + 64 + 10  # in the middle of a record's payload
    os.truncate(segment_path(store, seg), cut)
    check_damage(store, tmp_path, truth, {cid for o, n, cid in in_seg if o + 64 + n > cut})


def test_deleted_segment(damaged, tmp_path):
    store, truth = damaged
    seg = sorted({s for s, _, _ in truth.chunks.values()})[-1]
    segment_path(store, seg).unlink()
    check_damage(store, tmp_path, truth, {cid for cid, (s, _, _) in truth.chunks.items() if s == seg})


# -- a damaged catalog ----------------------------------------------------------------------


def pages_of(store: Path, name: str) -> list[int]:
    conn = sqlite3.connect(store / "catalog.db")
    try:
        return [r[0] for r in conn.execute("SELECT pageno FROM dbstat WHERE name=? ORDER BY pageno", (name,))]
    finally:
        conn.close()


def overwrite_pages(store: Path, pages: list[int]) -> None:
    with open(store / "catalog.db", "r+b") as f:
        for page in pages:
            f.seek((page - 1) * 4096)
            f.write(random.Random(page).randbytes(4096))


@pytest.mark.parametrize("index, readable", [("extents_cid", True), ("versions_ino", False)])
def test_damaged_index_pages_are_rebuilt(damaged, tmp_path, index, readable):
    store, truth = damaged
    overwrite_pages(store, pages_of(store, index))
    with mounted(store, tmp_path / "mnt") as m:
        # an index the reads use makes everything fail with EIO; never wrong bytes
        read_all(m, truth, set() if readable else set(truth.views.values()))
    out = assert_fsck_names(store, truth, set())
    assert "catalog:" in out
    r = cowfs("fsck", str(store), "--repair", check=False)
    assert r.returncode == 0 and b"catalog: rebuilt" in r.stdout, r.stdout.decode() + r.stderr.decode()
    repair_and_check(store, tmp_path / "mnt", truth, set())


def test_damaged_table_page_fails_reads_and_repair_changes_nothing(damaged, tmp_path):
    store, truth = damaged
    overwrite_pages(store, pages_of(store, "extents"))
    with mounted(store, tmp_path / "mnt") as m:
        assert sorted(os.listdir(m / "run")) == sorted(p.split("/")[-1] for v, p in truth.views if v is None
                                                       and p.startswith("/run/"))
        read_all(m, truth, set(truth.views.values()))
    lines = [line for line in (store / "cowfs.log").read_text().splitlines() if "corrupt data" in line]
    assert lines and all("catalog is damaged" in line for line in lines)
    before = checksums(store)
    out = assert_fsck_names(store, truth, set())
    assert "catalog:" in out
    r = cowfs("fsck", str(store), "--repair", check=False)
    out = r.stdout.decode()
    assert r.returncode == 1 and "cannot rebuild the catalog (table extents" in out, out + r.stderr.decode()
    assert "Traceback" not in out + r.stderr.decode()
    assert checksums(store) == before


def test_catalog_rows_that_parse_but_lie(damaged, tmp_path):
    """A body whose extents no longer start at 0, and an extent whose chunk row is gone: reads
    fail instead of returning zeros, and fsck names and repairs both."""
    store, truth = damaged
    shifted = truth.versions[truth.views[("round-0", "/run/optim.pt")]]
    dropped = truth.only_in("/other/model.safetensors", None)[0]
    conn = sqlite3.connect(store / "catalog.db")
    with conn:
        conn.execute("UPDATE extents SET file_offset = file_offset + 4096 WHERE content_id=?", (shifted.content_id,))
        conn.execute("DELETE FROM chunks WHERE cid=?", (dropped,))
    conn.close()
    bad = {v.vid for v in truth.versions.values() if v.content_id == shifted.content_id} | truth.needing({dropped})
    with mounted(store, tmp_path / "mnt") as m:
        read_all(m, truth, bad)
    assert_logged(store, truth, bad)
    assert_fsck_names(store, truth, bad)
    repair_and_check(store, tmp_path / "mnt", truth, bad)


def test_catalog_that_is_not_a_database(damaged, tmp_path):
    store, _ = damaged
    (store / "catalog.db").write_bytes(b"this is not a SQLite database\n" * 400)
    before = checksums(store)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    commands = [
        (("mount", str(store), str(mnt)), 2),
        (("stats", str(store)), 2),
        (("ls", str(store), "/run"), 2),
        (("cat", str(store), "/run/model.pt"), 2),
        (("log", str(store), "/run/model.pt"), 2),
        (("snapshot", "list", str(store)), 2),
        (("snapshot", "create", str(store), "x"), 2),
        (("restore", str(store), "/run/model.pt", "--snapshot", "round-0"), 2),
        (("prune", str(store), "--keep-last", "1"), 2),
        (("gc", str(store)), 2),
        (("fsck", str(store)), 1),
        (("fsck", str(store), "--repair"), 1),
    ]
    for args, code in commands:
        r = cowfs(*args, check=False)
        err = r.stderr.decode()
        assert r.returncode == code, (args, r.returncode, err)
        assert err.count("\n") == 1 and "catalog" in err and "not a database" in err, (args, err)
        assert str(mnt) not in mounted_cowfs()
    assert checksums(store) == before
