"""A store opens only its own catalog and segments (cowfs/store/recovery.py, check_ownership):
recovery deletes segment files the catalog does not know and cuts the others to their
committed end, so a segment of another store, a renamed one or another store's catalog is
refused with StoreError before anything changes; put back, both stores open and fsck clean.
A segment file whose header a crash left unwritten is still recovered as before, and fsck
reports a header that names another segment."""
from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from cowfs.errors import StoreError
from cowfs.store import ROOT_INO, Store
from cowfs.store.log.layout import CATALOG_FILE, SEGMENTS_DIR, segment_path
from cowfs.store.log.records import decode_segment_header, encode_segment_header
from tests.support.mountutil import cowfs as cowfs_cli
from tests.support.storeutil import assert_clean


def _store(path: Path, name: bytes, seed: int) -> Path:
    Store.init(path, device="file", segment_size=4 << 20)
    with Store.open(path) as s:
        s.mkdir(ROOT_INO, b"d")
        for k in range(3):
            s.write_file(f"/d/{name.decode()}{k}", hashlib.sha256(bytes([seed, k])).digest() * 40_000)
    return path


def _files(root: Path) -> dict[str, bytes]:
    """Every segment file and the catalog, by name, with a hash of its bytes."""
    out = {p.name: hashlib.sha256(p.read_bytes()).digest() for p in (root / SEGMENTS_DIR).iterdir()}
    out[CATALOG_FILE] = hashlib.sha256((root / CATALOG_FILE).read_bytes()).digest()
    return out


def _clean(path: Path) -> None:
    assert_clean(path)


@pytest.mark.parametrize("number", ["another", "the same"])
def test_a_segment_of_another_store_is_refused_and_left_as_it_is(tmp_path: Path, number: str) -> None:
    mine, theirs = _store(tmp_path / "mine", b"m", 1), _store(tmp_path / "theirs", b"t", 2)
    theirs_seg = sorted((theirs / SEGMENTS_DIR).glob("*.seg"))[0]
    target = segment_path(mine, 99) if number == "another" else segment_path(mine, int(theirs_seg.stem))
    moved_aside = target.with_suffix(".mine") if target.exists() else None
    if moved_aside is not None:
        target.rename(moved_aside)  # (its own file kept beside: the test puts it back)
    shutil.copyfile(theirs_seg, target)
    before = _files(mine)
    with pytest.raises(StoreError) as err:
        Store.open(mine)
    assert str(target) in str(err.value) and "a segment of store" in str(err.value)
    assert "nothing was changed" in str(err.value)
    assert _files(mine) == before  # neither deleted (an unknown number) nor cut (a known one)
    target.unlink()
    if moved_aside is not None:
        moved_aside.rename(target)
    _clean(mine)
    _clean(theirs)


def test_a_renamed_segment_is_refused_with_its_name(tmp_path: Path) -> None:
    mine = _store(tmp_path / "mine", b"m", 1)
    first = sorted((mine / SEGMENTS_DIR).glob("*.seg"))[0]
    renamed = segment_path(mine, 77)
    first.rename(renamed)
    before = _files(mine)
    with pytest.raises(StoreError) as err:
        Store.open(mine)
    assert f"give it back its name, {first.name}" in str(err.value)
    assert _files(mine) == before
    renamed.rename(first)
    _clean(mine)


def test_the_catalog_of_another_store_is_refused(tmp_path: Path) -> None:
    mine, theirs = _store(tmp_path / "mine", b"m", 1), _store(tmp_path / "theirs", b"t", 2)
    (mine / CATALOG_FILE).rename(mine / "catalog.mine")
    shutil.copyfile(theirs / CATALOG_FILE, mine / CATALOG_FILE)
    before = _files(mine)
    with pytest.raises(StoreError) as err:
        Store.open(mine)
    assert "is the catalog of store" in str(err.value) and "nothing was changed" in str(err.value)
    assert _files(mine) == before  # no segment of mine deleted as unknown to that catalog
    r = cowfs_cli("fsck", str(mine), check=False)  # the CLI says it in one line
    assert r.returncode != 0 and "is the catalog of store" in r.stderr.decode()
    assert len(r.stderr.decode().strip().splitlines()) == 1, r.stderr
    (mine / "catalog.mine").replace(mine / CATALOG_FILE)
    _clean(mine)


def test_a_segment_whose_header_a_crash_left_unwritten_is_still_deleted(tmp_path: Path) -> None:
    mine = _store(tmp_path / "mine", b"m", 1)
    orphan = segment_path(mine, 50)
    orphan.write_bytes(bytes(8192))  # created and preallocated, header not yet written: no commit names it
    _clean(mine)
    assert not orphan.exists()


def test_fsck_reports_a_header_that_names_another_segment_or_store(tmp_path: Path) -> None:
    mine = _store(tmp_path / "mine", b"m", 1)
    with Store.open(mine) as s:
        seg = sorted((mine / SEGMENTS_DIR).glob("*.seg"))[0]
        original = seg.read_bytes()[:64]
        header = decode_segment_header(original)
        with open(seg, "r+b") as f:  # changed under the open store
            f.write(encode_segment_header(header.seg_id + 1, header.store_uuid, header.created_ns, header.version))
        lines = [p.line() for p in s.fsck().problems]
        assert any(f"segment {header.seg_id}: its header names segment {header.seg_id + 1}" in x for x in lines), lines
        with open(seg, "r+b") as f:
            f.write(original)
    _clean(mine)
