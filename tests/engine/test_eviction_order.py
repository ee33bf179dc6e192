"""The order eviction takes segments in (store/upkeep/evict.py `eviction_order`): the segments only
older versions and snapshots read first, oldest first; then the others, those holding the
fewest of the current tree's bytes first. Checked against the current tree's extents as its
readers see them (the eviction itself runs against the real RGW: tests/remote/test_evict.py)."""
from __future__ import annotations

from pathlib import Path

from cowfs.store import ROOT_INO, Store
from cowfs.store.upkeep.evict import eviction_order, local_segments
from tests.support.storeutil import assert_clean, data, new_store


def current_bytes(s: Store, paths: list[str]) -> dict[int, int]:
    """Stored bytes per segment of the chunks these files' current versions read, each chunk once."""
    out: dict[int, int] = {}
    seen: set[bytes] = set()
    for p in paths:
        with s.open_reader(s.resolve(p).ino) as r:
            for e in r.extents:
                if e.chunk is None or e.loc is None or e.chunk in seen:
                    continue
                seen.add(e.chunk)
                out[e.loc.seg_id] = out.get(e.loc.seg_id, 0) + e.loc.stored_len
    return out


def test_segments_only_snapshots_read_go_first_then_fewest_current_bytes(tmp_path: Path) -> None:
    path = new_store(tmp_path / "s", segment_size=4 << 20)
    with Store.open(path) as s:
        s.mkdir(ROOT_INO, b"run")
        s.write_file("/run/config.bin", data(3 << 20, 1))  # the oldest segment, and current to the end
        s.write_file("/run/ckpt-0.bin", data(3 << 20, 2))
        s.write_file("/run/ckpt-1.bin", data(3 << 20, 3))
        s.snapshot_create("before")
        s.write_file("/run/ckpt-0.bin", data(3 << 20, 4))  # the first bodies: read by the snapshot only
        s.write_file("/run/ckpt-1.bin", data(1 << 20, 5))
        s.write_file("/run/ckpt-2.bin", data(3 << 20, 6))
        live = ["/run/config.bin", "/run/ckpt-0.bin", "/run/ckpt-1.bin", "/run/ckpt-2.bin"]
        expect = current_bytes(s, live)
        order = eviction_order(s)
        oldest_first = [seg for seg, _ in local_segments(s)]

        assert sorted(seg for seg, _, _ in order) == sorted(oldest_first)
        for seg, size, cur in order:
            assert cur == expect.get(seg, 0), seg
            assert size > 0
        keys = [(cur, oldest_first.index(seg)) for seg, _, cur in order]
        assert keys == sorted(keys)
        cold = [seg for seg, _, cur in order if cur == 0]
        assert cold, "the first bodies of ckpt-0 and ckpt-1 are in segments no current file reads"
        config_seg = next(iter(current_bytes(s, ["/run/config.bin"])))
        assert oldest_first[0] == config_seg and order[0][0] != config_seg  # not oldest first
        assert [seg for seg, _, _ in order].index(config_seg) > max(map([seg for seg, _, _ in order].index, cold))
        # the snapshot still reads what the eviction would take first
        assert s.read_file("/run/ckpt-0.bin", gen=s.snapshot("before").gen) == data(3 << 20, 2)
    assert_clean(path)


def test_a_store_without_files_or_with_only_the_head_has_nothing_to_order(tmp_path: Path) -> None:
    path = new_store(tmp_path / "s")
    with Store.open(path) as s:
        assert eviction_order(s) == []
        s.write_file("/a", data(1 << 20, 1))  # its one segment is the head: never evicted
        assert eviction_order(s) == []
    assert_clean(path)
