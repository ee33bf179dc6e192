"""The compactor (compact.py): checkpoint files re-cut into tensor pieces, encoded, and
superseded pieces turned into deltas; every version reads back byte-exact."""
from __future__ import annotations

import io
import sqlite3
from pathlib import Path

import pytest
import torch
from safetensors.torch import save as st_save

from cowfs.errors import CorruptData
from cowfs.store import Store
from cowfs.store.log.codecs import CODEC_GROUPED, CODEC_RAW, DELTA_CODECS
from cowfs.store.log.layout import CATALOG_FILE, MAX_CHAIN, segment_path, set_read_chain

ROWS, COLS = 512, 1024  # fp32: 2 MiB, two pieces per tensor


def weights(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {f"layers.{i}.weight": torch.randn(ROWS, COLS, generator=g) * 0.02 for i in range(3)}


def train_step(w: dict[str, torch.Tensor], step: int, frozen: tuple[str, ...] = ()) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    return {k: v if k in frozen else v - 1e-4 * torch.randn(v.shape, generator=g) for k, v in w.items()}


def torch_bytes(obj: object) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def series(store: Store, n: int, frozen: tuple[str, ...] = ()) -> dict[str, bytes]:
    """n HF-style checkpoints: checkpoint-i/model.safetensors, optimizer.pt, trainer_state.json."""
    files: dict[str, bytes] = {}
    w = weights()
    for i in range(n):
        w = train_step(w, i, frozen)
        store.mkdir(1, f"checkpoint-{i}".encode())
        files[f"/checkpoint-{i}/model.safetensors"] = st_save(w)
        files[f"/checkpoint-{i}/optimizer.pt"] = torch_bytes({"state": {k: {"exp_avg": v * 0.1} for k, v in w.items()}})
        files[f"/checkpoint-{i}/trainer_state.json"] = f'{{"global_step": {i * 20}}}'.encode()
        for path, data in files.items():
            if path.startswith(f"/checkpoint-{i}/"):
                store.write_file(path, data)
    return files


def series_step(store: Store, files: dict[str, bytes], i: int) -> dict[str, bytes]:
    """Checkpoint i of series() after checkpoints 0..i-1 (which `files` holds)."""
    w = weights()
    for step in range(i + 1):
        w = train_step(w, step)
    store.mkdir(1, f"checkpoint-{i}".encode())
    new = {f"/checkpoint-{i}/model.safetensors": st_save(w),
           f"/checkpoint-{i}/optimizer.pt": torch_bytes({"state": {k: {"exp_avg": v * 0.1} for k, v in w.items()}}),
           f"/checkpoint-{i}/trainer_state.json": f'{{"global_step": {i * 20}}}'.encode()}
    for path, data in new.items():
        store.write_file(path, data)
    return new


def assert_reads(store: Store, files: dict[str, bytes]) -> None:
    for path, data in files.items():
        assert store.read_file(path) == data, path


def chunk_rows(path: Path) -> list[tuple[int, int, int | None]]:
    conn = sqlite3.connect(path / CATALOG_FILE)
    try:
        return conn.execute("SELECT cid, codec, base_cid FROM chunks").fetchall()
    finally:
        conn.close()


def test_series_reads_back_exactly_and_shrinks(store):
    files = series(store, 6)
    before = store.stats()
    report = store.compact()
    assert report.recut == 12 and report.bodies == 18  # the json files are not recognised
    assert report.deltas > 0 and report.pieces == 12 * 6
    assert_reads(store, files)
    store.gc()
    after = store.stats()
    assert after["logical_bytes"] == before["logical_bytes"]
    assert after["stored_bytes"] < before["stored_bytes"]
    deltas = {c: after["codecs"].get(c, {}).get("chunks", 0) for c in ("sub", "xor", "fdelta")}
    assert sum(deltas.values()) == report.deltas and deltas["fdelta"] > 0, deltas  # f32 tensors: the float codec
    assert after["uncompacted_bodies"] == 0
    assert_reads(store, files)
    again = store.compact()
    assert again.bodies == 0 and again.deltas == 0


def piece_codecs(s: Store, directory: str, name: str = "model.safetensors") -> list[int]:
    """The codecs of the 1 MiB tensor pieces of /directory/name."""
    conn = s.catalog.reader()
    return [c for (c,) in conn.execute(
        "SELECT c.codec FROM chunks c JOIN extents e ON e.cid = c.cid JOIN versions v"
        " ON v.content_id = e.content_id WHERE e.length = ? AND v.ino = (SELECT ino FROM dentries WHERE name = ?"
        " AND parent = (SELECT ino FROM dentries WHERE name = ?))",
        (1 << 20, name.encode(), directory.encode()))]


def chain_lengths(path: Path) -> dict[int, int]:
    """Each chunk's records a read of it touches: itself and the bases it decodes through."""
    rows = {cid: base for cid, _codec, base in chunk_rows(path)}
    out = {}
    for cid in rows:
        n, at = 1, cid
        while rows[at] is not None and n <= MAX_CHAIN:
            at, n = rows[at], n + 1
        out[cid] = n
    return out


@pytest.mark.parametrize("read_chain", range(1, MAX_CHAIN + 1))
def test_no_read_touches_more_than_the_read_chain_and_the_newest_is_raw(store_path, read_chain):
    assert set_read_chain(store_path, read_chain) == (MAX_CHAIN, read_chain)
    with Store.open(store_path) as s:
        files = series(s, 3 * MAX_CHAIN)
        s.compact()
        s.gc()
    # the chains are used as far as the store's bound allows, and no further
    assert max(chain_lengths(store_path).values()) == read_chain
    newest = max(int(p.split("/")[1].split("-")[1]) for p in files)
    with Store.open(store_path) as s:
        assert set(piece_codecs(s, f"checkpoint-{newest}")) == {CODEC_RAW}  # read at disk speed
        for i in range(newest):  # every older piece is encoded: grouped, or a delta
            assert CODEC_RAW not in piece_codecs(s, f"checkpoint-{i}"), i
        assert_reads(s, files)


def test_a_lowered_read_chain_bounds_what_compaction_does_next_and_keeps_what_it_did(store_path):
    with Store.open(store_path) as s:
        files = series(s, 3)
        s.compact()
        s.gc()
    before = chain_lengths(store_path)
    assert max(before.values()) == 3  # the oldest through the two newer checkpoints
    assert set_read_chain(store_path, 2) == (MAX_CHAIN, 2)
    with Store.open(store_path) as s:
        for i in range(3, 8):
            files.update(series_step(s, files, i))
        s.compact()
        s.gc()
        assert_reads(s, files)
    after = chain_lengths(store_path)
    # a chain compacted before stays as it was (its pieces stay readable); none grows past the new bound
    assert all(n <= max(2, before.get(cid, 0)) for cid, n in after.items()), after
    assert max(n for cid, n in after.items() if cid not in before) == 2


def piece_rows(s: Store, directory: str, name: str = "model.safetensors") -> list[tuple[int, int | None]]:
    """(cid, base_cid) of the tensor pieces of /directory/name, in file order."""
    conn = s.catalog.reader()
    return conn.execute(
        "SELECT c.cid, c.base_cid FROM chunks c JOIN extents e ON e.cid = c.cid JOIN versions v"
        " ON v.content_id = e.content_id WHERE e.length = ? AND v.ino = (SELECT ino FROM dentries WHERE name = ?"
        " AND parent = (SELECT ino FROM dentries WHERE name = ?)) ORDER BY e.file_offset",
        (1 << 20, name.encode(), directory.encode())).fetchall()


def test_a_backlog_is_compacted_newest_first_writing_each_piece_once(store):
    files = series(store, 6)
    report = store.compact()
    # the pieces of model.safetensors and optimizer.pt (3 x 2 each per checkpoint) were stored
    # raw by the save, which cuts tensor files into pieces as they are written: those of
    # checkpoints 1-5 are each re-encoded once
    assert report.rewritten == 5 * 12 and report.deltas > 0
    assert_reads(store, files)
    files.update(series_step(store, files, 6))
    report = store.compact()
    # checkpoint-5's pieces (model 3 x 2, exp_avg 3 x 2) were raw, the newest: each is written
    # again, as a delta against checkpoint-6's or grouped
    assert report.rewritten == 12 and report.recut == 2
    assert set(piece_codecs(store, "checkpoint-6")) == {CODEC_RAW}
    assert CODEC_RAW not in piece_codecs(store, "checkpoint-5")
    store.gc()
    assert_reads(store, files)


def test_an_older_piece_leans_on_its_nearest_newer_neighbour(store):
    files = series(store, 1)
    store.compact()
    files.update(series_step(store, files, 1))
    files.update(series_step(store, files, 2))
    store.compact()  # checkpoint-2 first, then 1; checkpoint-0 (raw until now) must lean on 1, not 2
    zero, one, two = (piece_rows(store, f"checkpoint-{i}") for i in range(3))
    assert [base for _cid, base in zero] == [cid for cid, _base in one]
    assert [base for _cid, base in one] == [cid for cid, _base in two]
    store.gc()
    assert_reads(store, files)


def test_frozen_tensors_stay_shared(store):
    files = series(store, 4, frozen=("layers.0.weight", "layers.1.weight"))
    store.compact()
    store.gc()
    st = store.stats()
    # the two frozen tensors (2 x 2 MiB) are stored once across the 4 model files
    frozen_once = 2 * ROWS * COLS * 4
    assert st["unique_bytes"] < 4 * 3 * ROWS * COLS * 4 * 2 - 3 * frozen_once + (1 << 20)
    # the newest checkpoint shares the frozen pieces with the older ones: they are grouped, not
    # kept raw; only its own trained tensor's 2 pieces are raw
    assert sorted(piece_codecs(store, "checkpoint-3")) == [CODEC_RAW] * 2 + [CODEC_GROUPED] * 4
    assert_reads(store, files)


def test_lineage_follows_tensors_across_paths_and_rewrites(store):
    """Lightning-style new names per checkpoint, and torch.save rewriting one path."""
    w = weights()
    files: dict[str, bytes] = {}
    latest: list[bytes] = []
    for i in range(5):
        w = train_step(w, i)
        files[f"/epoch={i}-step={i * 10}.ckpt"] = torch_bytes({"state_dict": w, "epoch": i})
        store.write_file(f"/epoch={i}-step={i * 10}.ckpt", files[f"/epoch={i}-step={i * 10}.ckpt"])
        latest.append(torch_bytes(w))
        store.write_file("/model.pt", latest[-1])
    report = store.compact()
    assert report.deltas > 0
    store.gc()
    assert_reads(store, files)
    assert store.read_file("/model.pt") == latest[-1]
    history = store.history("/model.pt")
    for info, data in zip(reversed(history), latest):
        assert store.read_file("/model.pt", info.birth_gen) == data


def test_open_reader_survives_reencoding_and_gc(store_path):
    with Store.open(store_path) as s:
        files = series(s, 2)
        s.compact()
        attr = s.resolve("/checkpoint-1/model.safetensors")
        reader = s.open_reader(attr.ino)
        more = series_more(s, 2, 3)
        report = s.compact()
        assert report.deltas > 0  # checkpoint-1's pieces became deltas: their old records retired
        s.gc()
        data = files["/checkpoint-1/model.safetensors"]
        assert bytes(reader.read(0, len(data))) == data
        before = s.physical_bytes()
        reader.close()
        s.gc()  # now the retired records go
        assert s.physical_bytes() < before
        assert_reads(s, {**files, **more})


def series_more(store: Store, start: int, stop: int) -> dict[str, bytes]:
    w = weights()
    for i in range(start):
        w = train_step(w, i)
    files = {}
    for i in range(start, stop):
        w = train_step(w, i)
        store.mkdir(1, f"checkpoint-{i}".encode())
        files[f"/checkpoint-{i}/model.safetensors"] = st_save(w)
        store.write_file(f"/checkpoint-{i}/model.safetensors", files[f"/checkpoint-{i}/model.safetensors"])
    return files


def test_removing_checkpoints_that_are_bases_keeps_what_their_deltas_need(store):
    files = series(store, MAX_CHAIN)
    store.compact()
    for ckpt in (f"/checkpoint-{MAX_CHAIN - 1}", "/checkpoint-1"):  # the newest, and one in the chain
        for name in ("model.safetensors", "optimizer.pt", "trainer_state.json"):
            store.unlink(store.resolve(ckpt).ino, name.encode())
    store.expire_history()
    store.gc()
    kept = {p: d for p, d in files.items() if not p.startswith((f"/checkpoint-{MAX_CHAIN - 1}/", "/checkpoint-1/"))}
    assert_reads(store, kept)
    assert store.stats()["codecs"]["fdelta"]["chunks"] > 0


def test_damaged_base_fails_every_dependent_read_and_fsck_names_them(tmp_path):
    path = tmp_path / "store"
    Store.init(path, segment_size=4 << 20)
    with Store.open(path) as s:
        files = series(s, 3)
        s.compact()
        s.gc()
        conn = s.catalog.reader()
        seg, off = conn.execute(
            "SELECT b.seg_id, b.offset FROM chunks b WHERE b.base_cid IS NULL AND b.cid IN"
            " (SELECT base_cid FROM chunks WHERE base_cid IS NOT NULL) LIMIT 1").fetchone()
    with open(segment_path(path, seg), "r+b") as f:  # flip payload bytes of a piece others decode through
        f.seek(off + 64 + 1000)
        f.write(b"\xff" * 64)
    with Store.open(path) as s:
        failed = []
        for p, data in files.items():
            try:
                assert s.read_file(p) == data, p  # never wrong bytes
            except CorruptData:
                failed.append(p)
        # the newest (whole) piece and the older ones that decode through it
        assert {"/checkpoint-0/model.safetensors", "/checkpoint-1/model.safetensors",
                "/checkpoint-2/model.safetensors"} <= set(failed) or {"/checkpoint-0/optimizer.pt",
                "/checkpoint-1/optimizer.pt", "/checkpoint-2/optimizer.pt"} <= set(failed), failed
        report = s.fsck()
        named = {p for problem in report.problems for p in problem.paths}
        assert set(failed) <= named
        s.fsck(repair=True)
        after = s.fsck()
        assert after.clean, [p.line() for p in after.problems]


def test_unrecognised_and_empty_files_are_left_as_they_are(store):
    store.write_file("/notes.txt", b"hello " * 100_000)
    store.write_file("/empty.bin", b"")
    store.write_file("/fake.safetensors", b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}")
    before = store.stats()
    report = store.compact()
    assert report.bodies == 3 and report.recut == 0
    assert store.stats()["stored_bytes"] == before["stored_bytes"]
    assert store.read_file("/notes.txt") == b"hello " * 100_000


def test_stop_leaves_the_body_as_it_was(store):
    files = series(store, 2)
    report = store.compact(stop=lambda: True)
    assert report.stopped and report.recut == 0
    assert store.stats()["uncompacted_bodies"] == 6
    store.gc()
    assert_reads(store, files)
    assert store.compact().recut == 4


def test_a_stop_while_the_tensors_are_found_ends_the_run_unchanged(store):
    files = series(store, 2)  # 6 pending bodies: the tensors of all are found before any is done
    asked = []

    def stop() -> bool:  # a writer opens a file while the second body's tensors are read, then closes it
        asked.append(1)
        return len(asked) == 2

    report = store.compact(stop=stop)
    assert report.stopped and report.bodies == 0 and report.recut == 0
    assert store.stats()["uncompacted_bodies"] == 6
    assert_reads(store, files)
    assert store.compact().recut == 4


@pytest.mark.parametrize("workers", [1, 3])
def test_workers_give_the_same_store(tmp_path, workers):
    path = tmp_path / f"s{workers}"
    Store.init(path, segment_size=4 << 20)
    with Store.open(path) as s:
        files = series(s, 3)
        r = s.compact(workers=workers)
        assert r.deltas > 0
        s.gc()
        assert_reads(s, files)
        assert s.fsck().clean


# -- model-based: any interleaving of saves, rewrites, removals, snapshots, compactions and
# gc keeps every live file and every snapshot byte-exact ---------------------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as hs  # noqa: E402

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
OPS = hs.lists(hs.tuples(hs.sampled_from(["save", "save", "save", "remove", "snapshot", "compact", "gc", "rechain"]),
                         hs.integers(0, 3), hs.integers(0, 2)), min_size=1, max_size=14)


def model_file(step: int, dtype_ix: int, kind: int) -> bytes:
    g = torch.Generator().manual_seed(7)
    base = {f"t{i}": torch.randn(64 * (i + 1), 96, generator=g) for i in range(3)}
    g.manual_seed(100 + step)
    sd = {k: (v + 1e-3 * step * torch.randn(v.shape, generator=g)).to(DTYPES[dtype_ix]) for k, v in base.items()}
    return st_save(sd) if kind == 0 else torch_bytes(sd)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS, read_chain=hs.integers(1, MAX_CHAIN))
def test_model_compaction_never_changes_what_reads_return(tmp_path_factory, ops, read_chain):
    """Any interleaving keeps every live file and snapshot byte-exact, and no chain is longer
    than the longest read chain a compaction run had (`rechain`: the store closed, its read
    chain changed, reopened)."""
    path = tmp_path_factory.mktemp("model") / "store"
    Store.init(path, segment_size=4 << 20, read_chain=read_chain)
    live: dict[str, bytes] = {}
    snaps: dict[str, dict[str, bytes]] = {}
    step = 0
    longest = 0  # the longest read chain any run was allowed so far: no chain is longer
    s = Store.open(path)
    try:
        for op, a, b in ops:
            if op == "rechain":
                s.close()
                read_chain = 1 + (a + b) % MAX_CHAIN
                set_read_chain(path, read_chain)
                s = Store.open(path)
                continue
            if op == "compact":
                longest = max(longest, read_chain)
            if op == "save":
                step += 1
                name = f"/ckpt{a}.{'safetensors' if b == 0 else 'pt'}"
                live[name] = model_file(step, b, b % 2 if b else 0)
                s.write_file(name, live[name])
            elif op == "remove" and live:
                name = sorted(live)[a % len(live)]
                s.unlink(1, name[1:].encode())
                del live[name]
            elif op == "snapshot":
                snaps[f"s{len(snaps)}"] = dict(live)
                s.snapshot_create(f"s{len(snaps) - 1}")
            elif op == "compact":
                s.compact(workers=1 + a % 2)
            elif op == "gc":
                s.gc()
            assert_reads(s, live)
        for name, files in snaps.items():
            gen = s.snapshot(name).gen
            for p, data in files.items():
                assert s.read_file(p, gen) == data, (name, p)
        report = s.fsck()
        assert report.clean, [p.line() for p in report.problems]
    finally:
        s.close()
    assert max(chain_lengths(path).values(), default=1) <= max(longest, 1)


def test_a_damaged_body_is_skipped_and_the_others_are_compacted(tmp_path):
    path = tmp_path / "store"
    Store.init(path, segment_size=4 << 20)
    with Store.open(path) as s:
        files = series(s, 2)
        conn = s.catalog.reader()
        seg, off = conn.execute(
            "SELECT c.seg_id, c.offset FROM chunks c JOIN extents e ON e.cid = c.cid JOIN versions v"
            " ON v.content_id = e.content_id JOIN dentries d ON d.ino = v.ino WHERE d.name = ?"
            " AND (SELECT count(*) FROM extents x WHERE x.cid = c.cid) = 1"  # in no other file
            " ORDER BY c.cid LIMIT 1", (b"optimizer.pt",)).fetchone()
    with open(segment_path(path, seg), "r+b") as f:
        f.seek(off + 64 + 100)
        f.write(b"\x00" * 32)
    with Store.open(path) as s:
        report = s.compact()
        assert len(report.errors) == 1 and "not compacted" in report.errors[0]
        assert report.recut == 3
        intact = {p: d for p, d in files.items() if p != "/checkpoint-0/optimizer.pt"}
        assert_reads(s, intact)
        with pytest.raises(CorruptData):
            s.read_file("/checkpoint-0/optimizer.pt")
        s.fsck(repair=True)
        assert s.fsck().clean


def test_the_run_remembers_which_delta_won_per_tensor_and_checks_again() -> None:
    from cowfs.store.log.codecs import BLOSC_ONLY, CODEC_SUB, FDELTA_FIRST, FDELTA_ONLY, Encoded
    from cowfs.store.tensors.recent import RecentPieces
    recent = RecentPieces()
    key = b"tensor"
    assert recent.delta_order(key) == FDELTA_FIRST and recent.delta_order(None) == FDELTA_FIRST
    recent.note_winner(key, Encoded(CODEC_SUB, b"", b""))
    assert recent.delta_order(key) == BLOSC_ONLY
    recent.note_winner(key, None)  # no delta kept: nothing learnt
    assert recent.delta_order(key) == BLOSC_ONLY
    orders = []
    for _ in range(RecentPieces.RECHECK):
        recent.note_winner(key, Encoded(4, b"", b""))
        orders.append(recent.delta_order(key))
    assert orders.count(FDELTA_FIRST) == 1 and orders.count(FDELTA_ONLY) == RecentPieces.RECHECK - 1


def test_pieces_the_save_stored_raw_become_deltas_against_their_newer_neighbour_read_back(store, monkeypatch):
    """model.safetensors and optimizer.pt are cut into pieces as they are written, so the
    compactor finds each older piece stored raw already: it re-encodes it as a delta against the newer piece, whose
    bytes it reads back from the log when the run's memory of recent pieces does not hold them."""
    from cowfs.store.tensors.recent import RecentPieces
    monkeypatch.setattr(RecentPieces, "get", lambda self, key, index, chunk: None)
    files = series(store, 4)
    report = store.compact()
    assert report.rewritten == 3 * 12 and not report.errors
    assert set(piece_codecs(store, "checkpoint-3")) == {CODEC_RAW}
    for i in range(3):
        codecs = piece_codecs(store, f"checkpoint-{i}")
        assert len(codecs) == 6 and set(codecs) <= set(DELTA_CODECS), (i, codecs)
    store.gc()
    assert_reads(store, files)


def test_a_gc_beside_the_compactor_keeps_the_records_it_appended_but_not_yet_committed(store, monkeypatch):
    """A gc that runs after the compactor's writer appended records and before the compactor
    took their locations (its next append, or its commit) must keep them: they are registered
    with the append, under gc_lock. Registered later, gc punched them as garbage, and the
    compactor's commit then pointed at zeros (fsck at teardown and the reads below fail)."""
    from cowfs.store.tensors.compact_body import Body

    files = series(store, 3)
    real_settle = Body._settle
    gcs = []

    def settle_after_a_gc(self) -> None:
        if self.appends:
            for fut, _done in self.appends:
                fut.result()  # written, not yet taken by the compactor
            store.gc()
            gcs.append(1)
        real_settle(self)

    monkeypatch.setattr(Body, "_settle", settle_after_a_gc)
    report = store.compact()
    assert gcs and report.recut > 0
    assert_reads(store, files)
    store.gc()
    assert_reads(store, files)
