"""The remote tier's parts that need no bucket: addresses, config, packs and indexes, remote.db,
doomed lists (remote gc)."""
from __future__ import annotations

import json
import os
import random
import sqlite3
import zlib

import pytest

from cowfs.errors import CorruptData, InvalidArgument, RemoteError
from cowfs.remote import deltas
from cowfs.remote.config import (
    REMOTE_FILE,
    RemoteConfig,
    parse_url,
    read_remote_config,
    remove_remote_config,
    write_remote_config,
)
from cowfs.remote.doomed import CLOCK_STEP, DoomedPack, ListedDoomed, decode_doomed, encode_doomed
from cowfs.remote.gc import check_grace
from cowfs.remote.packs import PackArena, PackBuilder, PackEntry, decode_index, entries_of_pack, is_pack_name, pack_name
from cowfs.remote.state import RemoteState
from cowfs.store import ROOT_INO
from cowfs.store.data.chunking import chunk_id
from cowfs.store.log.records import CODEC_RAW, encode_record
from cowfs.units import human_duration, parse_duration


def test_parse_url():
    a = parse_url("s3://ckpts/run1/a/")
    assert (a.bucket, a.prefix, a.url) == ("ckpts", "run1/a", "s3://ckpts/run1/a")
    assert a.key("packs", "x") == "run1/a/packs/x"
    b = parse_url("s3://ckpts")
    assert b.prefix == "" and b.key("index", "y") == "index/y"
    for bad in ("http://x/y", "s3://A_b/x", "s3://ab", "s3://ok-bucket/a//b", "s3://ok-bucket/../x"):
        with pytest.raises(InvalidArgument):
            parse_url(bad)


def test_config_round_trip_and_checks(tmp_path):
    root = tmp_path / "store"
    root.mkdir()
    assert read_remote_config(root) is None
    creds = tmp_path / "creds"
    creds.write_text("[default]\naws_access_key_id = a\naws_secret_access_key = b\n")
    cfg = RemoteConfig("s3://ckpts/run1", endpoint="http://127.0.0.1:9", credentials_file=str(creds))
    write_remote_config(root, cfg)
    assert read_remote_config(root) == cfg
    data = json.loads((root / REMOTE_FILE).read_text())
    assert data["format"] == "cowfs-remote" and "secret" not in json.dumps(data)
    inside = root / "creds"
    inside.write_text(creds.read_text())
    for bad in (RemoteConfig("s3://ckpts/x", endpoint="ftp://h"),
                RemoteConfig("s3://ckpts/x", credentials_file="relative/creds"),
                RemoteConfig("s3://ckpts/x", credentials_file=str(inside)),
                RemoteConfig("s3://ckpts/x", credentials_file=str(tmp_path / "missing"))):
        with pytest.raises(InvalidArgument):
            write_remote_config(root, bad)
    assert read_remote_config(root) == cfg  # a refused change leaves the old one
    (root / REMOTE_FILE).write_text("{not json")
    with pytest.raises(RemoteError, match="unreadable remote config"):
        read_remote_config(root)
    assert remove_remote_config(root) and not remove_remote_config(root)


def _records(n: int, seed: int = 0) -> list[tuple[bytes, bytes]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        raw = rng.randbytes(rng.randrange(1, 5000))
        out.append((chunk_id(raw), encode_record(chunk_id(raw), raw, len(raw), CODEC_RAW)))
    return out


def _pack(records: list[tuple[bytes, bytes]]) -> tuple[str, bytes, bytes]:
    b = PackBuilder()
    for cid, rec in records:
        n = int.from_bytes(rec[8:12], "little")
        b.add(rec, cid, n, n, CODEC_RAW)
    name, bodies, index = b.finish()
    return name, b"".join(bodies), index


def test_pack_and_index_round_trip():
    recs = _records(20)
    name, data, index = _pack(recs)
    assert is_pack_name(name) and name == pack_name(data)
    idx = decode_index(index, expect_name=name)
    assert idx.size == len(data) and [e.chunk_id for e in idx.entries] == [c for c, _ in recs]
    # the index is a function of the pack's bytes: adopting a pack rebuilds it exactly
    assert entries_of_pack(data) == idx.entries
    for e in idx.entries:
        assert data[e.offset + 16:e.offset + 48] == e.chunk_id


def test_damaged_pack_and_index_are_refused():
    name, data, index = _pack(_records(5, seed=1))
    bad = bytearray(data)
    bad[200] ^= 1
    with pytest.raises(CorruptData):
        entries_of_pack(bytes(bad))
    with pytest.raises(CorruptData, match="checksum"):
        decode_index(index[:-5] + bytes([index[-5] ^ 1]) + index[-4:])
    with pytest.raises(CorruptData, match="truncated"):
        decode_index(index[:10])
    other, _, _ = _pack(_records(2, seed=2))
    with pytest.raises(CorruptData, match="names pack"):
        decode_index(index, expect_name=other)


def test_state_is_a_cache_of_one_bucket(tmp_path):
    recs = _records(6, seed=3)
    name, data, index = _pack(recs)
    st = RemoteState(tmp_path / "remote.db", "s3://a-bucket/p")
    st.add_pack(name, len(data), decode_index(index).entries, mine=True)
    st.add_pack(name, len(data), decode_index(index).entries, mine=True)  # again: no change
    hashes = [c for c, _ in recs]
    assert st.has(hashes + [b"\0" * 32]) == set(hashes)
    assert st.pack_of(hashes[2]) == name and st.where(hashes[2]).offset == decode_index(index).entries[2].offset
    assert st.totals()["packs"] == 1 and st.totals()["uploaded_bytes"] == len(data)
    st.close()
    # another bucket: the facts about the first are forgotten
    st = RemoteState(tmp_path / "remote.db", "s3://b-bucket/p")
    assert st.has(hashes) == set() and st.totals()["packs"] == 0
    st.close()


def copy_catalog(store, dest):
    return deltas.take(store, None, None, dest).generation


def test_copy_catalog_is_one_generation(store, tmp_path):
    store.mkdir(ROOT_INO, b"run")
    store.write_file("/run/x", b"x")
    assert copy_catalog(store, tmp_path / "copy.db") == store.generation
    conn = sqlite3.connect(tmp_path / "copy.db")
    assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    conn.close()
    assert pack_name(b"") == "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"  # BLAKE3 of nothing


def test_background_passes_run_at_a_lower_cpu_priority(store, monkeypatch):
    import os
    import threading

    from cowfs.remote import tier as tier_module

    write_remote_config(store.root, RemoteConfig("s3://ckpts/p", endpoint="http://127.0.0.1:1"))
    seen = []

    def fake_push(*args, **kwargs):  # no bucket needed: where and how the pass runs is what counts
        seen.append((threading.get_native_id(), os.getpriority(os.PRIO_PROCESS, threading.get_native_id())))
        return "report"

    monkeypatch.setattr(tier_module, "push", fake_push)
    t = tier_module.RemoteTier(store)
    assert t.push(background=True) == "report" and t.push() == "report"
    (bg_tid, bg_nice), (fg_tid, fg_nice) = seen
    assert bg_nice == os.getpriority(os.PRIO_PROCESS, 0) + tier_module.UPLOAD_NICE
    assert fg_tid == threading.get_native_id() and fg_nice == os.getpriority(os.PRIO_PROCESS, 0)


def test_a_pack_never_gets_a_name_to_avoid():
    recs = _records(3, seed=4)
    name, data, _ = _pack(recs)
    b = PackBuilder()
    for cid, rec in recs:
        n = int.from_bytes(rec[8:12], "little")
        b.add(rec, cid, n, n, CODEC_RAW)
    other, bodies2, index2 = b.finish(avoid={name})  # the records in reverse order
    data2 = b"".join(bodies2)
    assert other != name and other == pack_name(data2) and b.size == len(data2)
    assert [e.chunk_id for e in b.entries] == [c for c, _ in recs][::-1]
    assert entries_of_pack(data2) == b.entries == decode_index(index2, expect_name=other).entries
    (cid, rec), = _records(1, seed=5)
    single, _, _ = _pack([(cid, rec)])
    b = PackBuilder()
    n = int.from_bytes(rec[8:12], "little")
    b.add(rec, cid, n, n, CODEC_RAW)
    third, bodies3, _ = b.finish(avoid={single})  # one record: it is laid out twice
    data3 = b"".join(bodies3)
    assert third != single and data3 == rec + rec and entries_of_pack(data3) == b.entries


def test_doomed_list_round_trip_and_damage():
    packs = [DoomedPack(pack_name(bytes([k])), 1000 + k, 1_700_000_000_000 + k) for k in range(3)]
    store_uuid = "0b1e6a52-54b5-4c1f-9d5e-0f8b3c2d1a00"
    name, data = encode_doomed(2.5, 123, store_uuid, packs + [DoomedPack(pack_name(b"x"), 0, 0)])
    assert is_pack_name(name) and name == pack_name(data) and len(data) == 48 + 4 * 48 + 4
    d = decode_doomed(data, expect_name=name)
    assert (d.grace, d.created_ns, d.store_uuid, d.packs[:3]) == (2.5, 123, store_uuid, packs)
    assert d.packs[3].size == 0 and d.packs[3].modified_ms == 0
    bad = bytearray(data)
    bad[60] ^= 1
    with pytest.raises(CorruptData, match="checksum"):
        decode_doomed(bytes(bad))
    with pytest.raises(CorruptData, match="truncated"):
        decode_doomed(data[:20])
    with pytest.raises(CorruptData, match="not to its name"):
        decode_doomed(data, expect_name=pack_name(b"other"))
    with pytest.raises(CorruptData, match="not a cowfs doomed list"):
        decode_doomed(_recrc(b"CWFSIDX1" + data[8:-4]))


def _recrc(body: bytes) -> bytes:
    import struct
    import zlib

    return body + struct.pack("<I", zlib.crc32(body))


def test_a_doomed_list_is_due_after_its_grace_on_the_engines_clock():
    name, data = encode_doomed(2.0, 0, "0b1e6a52-54b5-4c1f-9d5e-0f8b3c2d1a00", [])
    listed = ListedDoomed("p/gc/x.doomed", name, 1000.0, decode_doomed(data))
    assert not listed.due(1000.0 + 2.0) and not listed.due(1000.0 + 2.0 + CLOCK_STEP - 0.001)
    assert listed.due(1000.0 + 2.0 + CLOCK_STEP)
    assert not ListedDoomed("p/gc/y.doomed", name, 0.0, None, "damaged").due(1e12)  # names nothing
    check_grace(2.0)
    with pytest.raises(InvalidArgument, match="too short"):
        check_grace(1.5)


def test_durations_print_as_they_parse():
    for seconds in (2.0, 2.5, 59.0, 60.0, 3600.0, 5400.0, 86400.0 + 3600.0, 7 * 86400.0):
        assert parse_duration(human_duration(seconds)) == seconds
    assert human_duration(3600) == "1h" and human_duration(2) == "2s" and human_duration(5400) == "1h30m"


def test_doomed_packs_count_as_not_in_the_bucket(store, tmp_path):
    store.mkdir(ROOT_INO, b"run")
    store.write_file("/run/x", random.Random(6).randbytes(300_000))
    copy_catalog(store, tmp_path / "copy.db")
    st = RemoteState(tmp_path / "remote.db", "s3://a-bucket/p")
    need = st.missing_chunks(tmp_path / "copy.db")
    assert need
    hashes = [h for h, _ in need]
    entries = [PackEntry(h, 64 * k, n, n, CODEC_RAW) for k, (h, n) in enumerate(need)]
    one, two = pack_name(b"one"), pack_name(b"two")
    st.add_pack(one, 1 << 20, entries, mine=True)
    st.add_pack(two, 1 << 20, entries[:1], mine=False)  # the first chunk is in both packs
    assert st.missing_chunks(tmp_path / "copy.db") == [] and st.has(hashes) == set(hashes)
    st.set_doomed({"list-a": [one]})
    assert st.doomed_packs() == {one} and st.doomed_lists() == {"list-a"} and st.packs_of_list("list-a") == [one]
    assert [h for h, _ in st.missing_chunks(tmp_path / "copy.db")] == hashes[1:]  # the first is in `two`
    assert st.has(hashes) == {hashes[0]}
    assert st.location(hashes[0])[0] == two  # an undoomed copy first
    assert [p for p, _ in st.locations(hashes[0])] == [two, one] and st.location(hashes[1])[0] == one
    assert st.forget_packs([two, pack_name(b"unknown")]) == 1
    assert st.known_packs() == {one} and st.location(hashes[0])[0] == one
    st.set_doomed({})
    assert st.missing_chunks(tmp_path / "copy.db") == [] and st.totals()["doomed_packs"] == 0
    # packs are numbered for good: a consumer's catalogs name them by number
    ids = dict(st.conn.execute("SELECT name, id FROM packs"))
    st.forget_packs([one])
    st.add_pack(two, 1 << 20, entries[:1], mine=False)
    assert st.conn.execute("SELECT id FROM packs WHERE name=?", (two,)).fetchone()[0] > ids[one]
    st.close()


def test_remote_db_of_the_layout_before_gc_is_emptied(tmp_path):
    old = sqlite3.connect(tmp_path / "remote.db")
    old.executescript("CREATE TABLE meta (key TEXT PRIMARY KEY, value NOT NULL) WITHOUT ROWID;"
                      "INSERT INTO meta VALUES ('url', 's3://a-bucket/p');"
                      "CREATE TABLE packs (name TEXT PRIMARY KEY, size INTEGER NOT NULL, records INTEGER NOT NULL,"
                      " added_ns INTEGER NOT NULL, mine INTEGER NOT NULL);"
                      "INSERT INTO packs VALUES ('x', 1, 1, 1, 1);"
                      "CREATE TABLE objects (hash BLOB PRIMARY KEY, pack TEXT NOT NULL, offset INTEGER NOT NULL,"
                      " stored_len INTEGER NOT NULL, raw_len INTEGER NOT NULL, codec INTEGER NOT NULL) WITHOUT ROWID;")
    old.close()
    st = RemoteState(tmp_path / "remote.db", "s3://a-bucket/p")
    assert st.reset and st.known_packs() == set()
    recs = _records(2, seed=7)
    name, data, index = _pack(recs)
    st.add_pack(name, len(data), decode_index(index).entries, mine=True)
    st.close()
    st = RemoteState(tmp_path / "remote.db", "s3://a-bucket/p")  # the new layout is kept
    assert not st.reset and st.known_packs() == {name}
    st.close()


def test_the_s3_checksum_is_zlibs_crc32_big_endian_in_base64() -> None:
    import base64

    from cowfs.remote.s3 import _crc32

    for body in (b"", b"a", bytes(range(256)) * 1000, os.urandom(70000)):
        assert base64.b64decode(_crc32(body)) == zlib.crc32(body).to_bytes(4, "big")


def test_a_forgotten_pack_asks_for_a_whole_catalog_until_one_read_after_it_went_up(tmp_path):
    st = RemoteState(tmp_path / "remote.db", "s3://a-bucket/p")
    name = pack_name(b"p")
    st.add_pack(name, 100, [PackEntry(b"\1" * 32, 0, 10, 10, CODEC_RAW)], mine=True)
    assert st.full_check_due() is None
    assert st.forget_packs([name]) == 1
    first = st.full_check_due()
    assert first is not None
    st.add_pack(name, 100, [], mine=True)
    st.forget_packs([name])  # forgotten again while that whole catalog was going up
    st.full_check_done(first)
    assert st.full_check_due() is not None
    st.full_check_done(st.full_check_due())
    assert st.full_check_due() is None
    st.close()


def test_the_chain_to_a_generation_is_the_shortest_from_a_held_one_or_a_whole_one():
    from cowfs.remote.catalogs import CatalogObject, chain_ends, chain_to

    def obj(gen, frm=None):
        return CatalogObject("u", gen, f"k{gen}-{frm}", 1, frm)

    w4, w9 = obj(4), obj(9)
    d6, d8, d9, d12, d8b = obj(6, 4), obj(8, 6), obj(9, 8), obj(12, 9), obj(8, 4)  # d8b: a duplicate a crash left
    objects = [w4, d6, d8, d8b, w9, d9, d12]
    assert chain_to(objects, 12, set()) == [w9, d12]
    assert chain_to(objects, 12, {8}) == [d9, d12]  # from what is held: as many objects as from w9
    assert chain_to(objects, 8, set()) == [w4, d8b]  # the fewest objects
    assert chain_to(objects, 7, set()) is None
    assert chain_to(objects, 8, {8}) == []
    assert chain_to(objects, 9, {8}) == [d9]  # not the whole catalog of 9
    assert chain_ends(objects) == [[w4, d8b, d9, d12], [w9, d12]]


def test_a_pack_laid_out_in_an_arena_is_the_same_pack_sent_without_copies():
    """Records read into an arena's parts (some across two parts) give the pack, name and
    index the plain builder gives; the parts go to the PUT as they are, but the last one."""
    recs = _records(9, seed=6)
    name, data, index = _pack(recs)
    arena = PackArena(len(data) + 1000, part=len(data) // 3 + 7)
    b = PackBuilder(arena)
    for cid, rec in recs:
        bufs = b.reserve(len(rec))
        at = 0
        for v in bufs:
            v[:] = rec[at:at + len(v)]
            at += len(v)
        n = int.from_bytes(rec[8:12], "little")
        b.add(rec, cid, n, n, CODEC_RAW)
    got_name, bodies, got_index = b.finish()
    assert (got_name, b"".join(bodies), got_index) == (name, data, index)
    assert len(bodies) == 3 and bodies[0] is arena.parts[0] and bodies[1] is arena.parts[1]
    assert isinstance(bodies[2], bytes)  # the last part, cut to the pack's end
    other, moved, _ = b.finish(avoid={name})  # a doomed name: laid out again, as without an arena
    assert other != name and other == pack_name(b"".join(moved))


def test_records_read_into_a_packs_buffers_are_checked_as_read_whole(store, monkeypatch):
    """read_records into buffers of odd sizes (records across two of them) returns the same
    checked records as one buffer; a damaged byte is found either way."""
    from cowfs.remote.upload import _runs, read_records
    from cowfs.store.log.log import LOCATION_COLS, location
    store.mkdir(ROOT_INO, b"run")
    store.write_file("/run/a.bin", os.urandom(3 << 20))
    rows = store.catalog.read(lambda c: c.execute(f"SELECT hash, {LOCATION_COLS} FROM chunks").fetchall())
    locs = sorted(((bytes(h), location(*loc)) for h, *loc in rows), key=lambda x: (x[1].seg_id, x[1].offset))
    (run,) = _runs(locs)
    whole = [bytes(r) for r in read_records(store, run)]
    total = sum(len(r) for r in whole)
    bufs = [memoryview(bytearray(n)) for n in (100_003, 7, 1000, 65_536, total - 166_546)]
    assert [bytes(r) for r in read_records(store, run, bufs)] == whole
    assert any(isinstance(r, bytes) for r in read_records(store, run, bufs))  # across two buffers or more
    seg = store.log.segment(run[0][1].seg_id)
    real = seg.read_into

    def damaged(offset: int, buffers: list[memoryview]) -> int:  # one byte flipped on its way in
        n = real(offset, buffers)
        buffers[3][500] ^= 1
        return n

    monkeypatch.setattr(seg, "read_into", damaged)
    with pytest.raises(CorruptData, match="CRC|checksum|mismatch"):
        read_records(store, run, bufs)
