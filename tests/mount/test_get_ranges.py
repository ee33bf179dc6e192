"""Gets of ranges (issue 34; cowfs/fs/get_op.py, cowfs/plugins/get.py): only the bytes of the
ranges asked for, widened to whole chunks, read and checked; the file object reads in the
file's offsets, outside the ranges got on their own; malformed ranges get EINVAL; a damaged
chunk outside the ranges does not fail them; `cowfs.dcp.Reader` gets only the items a plan
reads. And a get into a kept memfd that held other bytes gives zeros for a file's holes."""
from __future__ import annotations

import errno
import os
import random
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp

import cowfs.dcp
from cowfs.plugins import get as get_mod
from cowfs.plugins.bulk import BulkRefused, daemon_socket, request
from cowfs.plugins.get import open_read
from cowfs.plugins.part_memfds import PartMemfds
from tests.support.mountutil import mounted, new_store
from tests.support.storeutil import damage_middle_chunk

pytestmark = pytest.mark.mount
MIB = 1 << 20


def _content() -> bytes:
    """Random bytes (chunks cut by content), zeros, random again, and a ragged end."""
    rng = random.Random(7)
    return rng.randbytes(9 * MIB) + bytes(3 * MIB) + rng.randbytes(5 * MIB + 4321)


def _random_ranges(rng: random.Random, size: int) -> list[tuple[int, int]]:
    cuts = sorted(rng.sample(range(size), rng.randint(2, 12)))
    pairs = list(zip(cuts[::2], cuts[1::2]))
    return [(lo, hi - lo) for lo, hi in pairs if hi > lo]


@pytest.mark.parametrize("kept", [False, True])
def test_a_ranged_get_reads_as_the_file_does(store_path: Path, tmp_path: Path, kept: bool) -> None:
    content = _content()
    rng = random.Random(11 + kept)
    with mounted(store_path, tmp_path / "m") as mnt:
        (mnt / "f").write_bytes(content)
        for _ in range(12):
            ranges = _random_ranges(rng, len(content)) + [(len(content) - 10, 100)]  # one past the end: cut there
            ranges = sorted(ranges)
            ranges = [r for i, r in enumerate(ranges) if i == 0 or r[0] >= sum(ranges[i - 1])]
            with open_read(mnt / "f", kept=kept, ranges=ranges) as f:
                assert isinstance(f, get_mod._WindowedBytes) and f._held[0] is not None
                held = sum(n for _o, n, _at in f._held[0].ranges)
                assert held < len(content)  # not the whole file
                for off, n in ranges:
                    f.seek(off)
                    assert f.read(n) == content[off:off + n]
                    buf = bytearray(n + 7)  # across the range's end: the rest got on its own
                    f.seek(off)
                    assert f.readinto(buf) == min(n + 7, len(content) - off)
                    assert bytes(buf[:min(n + 7, len(content) - off)]) == content[off:off + n + 7]
                f.seek(0)
                assert f.read() == content  # every byte, inside the ranges or not


def test_many_ranges_are_joined_to_fit_a_request() -> None:
    ranges = [(k * 1000 + (k % 7), 10) for k in range(1000)]
    fit = get_mod.fitted(ranges)
    assert len(fit) == get_mod.MAX_SENT
    assert all(any(o <= r[0] and r[0] + r[1] <= o + n for o, n in fit) for r in ranges)  # every one still in
    assert all(fit[i][0] + fit[i][1] < fit[i + 1][0] for i in range(len(fit) - 1))
    assert get_mod.fitted(ranges[:5]) == ranges[:5]


def test_malformed_ranges_are_refused(store_path: Path, tmp_path: Path) -> None:
    with mounted(store_path, tmp_path / "m") as mnt:
        (mnt / "f").write_bytes(b"x" * 100_000)
        fd = os.open(mnt / "f", os.O_RDONLY)
        try:
            for bad in ([[10, 5], [0, 5]], [[0, 10], [5, 10]], [[0, 0]], [[-1, 5]], [[0, True]], [[0]], "0-5",
                        [[0, 5.0]], [[i, 1] for i in range(0, 2 * 257, 2)]):
                sock = daemon_socket(fd)
                assert sock is not None
                with sock, pytest.raises(BulkRefused) as err:
                    request(sock, {"op": "get", "fd": fd, "ranges": bad}, [], "f")
                assert err.value.errno == errno.EINVAL and "ranges" in str(err.value), bad
            sock = daemon_socket(fd)
            assert sock is not None
            with sock:  # ranges all past the end: nothing to read, nothing filled
                result, fds = request(sock, {"op": "get", "fd": fd, "ranges": [[200_000, 10]]}, [], "f")
            for extra in fds:
                os.close(extra)
            assert result["ranges"] == [] and result["filled"] == 0 and result["size"] == 100_000
        finally:
            os.close(fd)


def test_a_damaged_chunk_fails_only_the_ranges_that_hold_it(tmp_path: Path) -> None:
    store_path = new_store(tmp_path / "store", segment_size=16 << 20)  # (damaged: not the fsck'ed fixture)
    data = os.urandom(6 * MIB)
    with mounted(store_path, tmp_path / "m") as mnt:
        (mnt / "f").write_bytes(data)
    damaged, _length = damage_middle_chunk(store_path, "/f")
    with mounted(store_path, tmp_path / "m") as mnt:
        with open_read(mnt / "f", ranges=[(0, 4096), (len(data) - 4096, 4096)]) as f:
            f.seek(len(data) - 4096)
            assert f.read() == data[-4096:]
        with pytest.raises(OSError) as err:
            open_read(mnt / "f", kept=True, ranges=[(damaged + 10, 100)])
        assert err.value.errno == errno.EIO and "damaged" in str(err.value)


def test_a_kept_memfd_that_held_other_bytes_gives_zeros_for_holes(store_path: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    pool = PartMemfds(keep=64 * MIB)  # its own: memfds kept by earlier tests would fit better
    monkeypatch.setattr(get_mod, "part_memfds", lambda: pool)
    with mounted(store_path, tmp_path / "m") as mnt:
        (mnt / "ones").write_bytes(b"\xff" * (4 * MIB))
        with open(mnt / "sparse", "wb") as f:  # a hole first, then bytes, then a hole
            f.seek(2 * MIB)
            f.write(b"x" * 1000)
            f.truncate(3 * MIB)
        with open(mnt / "holes", "wb") as f:  # nothing but a hole
            f.truncate(3 * MIB)
        for name in ("sparse", "holes"):
            with open_read(mnt / "ones", kept=True) as f:
                assert f.read() == b"\xff" * (4 * MIB)
                memfd = f.fileno()
            with open_read(mnt / name, kept=True) as f:
                assert f.fileno() == memfd  # the same memfd, which held the ones
                assert f.read() == (mnt / name).read_bytes()


def test_a_model_only_dcp_load_gets_the_models_items_only(store_path: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(3)
    model = {f"layer{i}.weight": torch.randn(256, 1024) for i in range(4)}
    optim = {f"state.{i}.{k}": torch.randn(256, 1024) for i in range(4) for k in ("exp_avg", "exp_avg_sq")}
    asked: list[tuple[str, Any, int]] = []
    real_get = get_mod._get

    def noting(sock, fd, what, kept, ranges, gen):  # type: ignore[no-untyped-def]
        got = real_get(sock, fd, what, kept, ranges, gen)
        held = sum(n for _o, n in got.ranges) if got.ranges is not None else os.fstat(fd).st_size
        asked.append((os.path.basename(what), ranges, held))
        return got

    with mounted(store_path, tmp_path / "m") as mnt:
        where = mnt / "ckpt"
        dcp.save({"model": model, "optim": optim}, storage_writer=cowfs.dcp.Writer(where), no_dist=True)
        size = os.stat(where / "__0_0.distcp").st_size
        monkeypatch.setattr(get_mod, "_get", noting)
        back = {"model": {k: torch.zeros_like(v) for k, v in model.items()}}
        dcp.load(back, storage_reader=cowfs.dcp.Reader(where), no_dist=True)
        assert all(torch.equal(back["model"][k], v) for k, v in model.items())
        (name, ranges, held), = [a for a in asked if a[0].endswith(".distcp")]
        assert ranges and held < size / 2, (ranges, held, size)  # a third of the file: the model's items
        asked.clear()
        whole = {"model": {k: torch.zeros_like(v) for k, v in model.items()},
                 "optim": {k: torch.zeros_like(v) for k, v in optim.items()}}
        dcp.load(whole, storage_reader=cowfs.dcp.Reader(where), no_dist=True)
        assert all(torch.equal(whole["optim"][k], v) for k, v in optim.items())
        (name, ranges, held), = [a for a in asked if a[0].endswith(".distcp")]
        assert ranges is None and held == size  # every item: got whole


def test_a_range_inside_a_hole_is_not_widened_into_it(store_path: Path, tmp_path: Path) -> None:
    with mounted(store_path, tmp_path / "m") as mnt:
        (mnt / "ones").write_bytes(b"\xff" * MIB)
        with open(mnt / "sparse", "wb") as f:  # 64 MiB of hole, then bytes
            f.seek(64 * MIB)
            f.write(b"y" * 5000)
        with open_read(mnt / "ones", kept=True) as f:
            f.read()
        for ranges in ([(10 * MIB, 100)], [(64 * MIB - 50, 100)]):
            with open_read(mnt / "sparse", kept=True, ranges=ranges) as f:
                held = sum(n for _o, n, _a in f._held[0].ranges)
                assert held < MIB, f._held[0].ranges  # the hole's part asked for (and the chunk after), not the hole
                off, n = ranges[0]
                f.seek(off)
                assert f.read(n) == bytes(max(0, min(n, 64 * MIB - off))) + b"y" * max(0, off + n - 64 * MIB)


def test_items_are_coalesced_into_ranges() -> None:
    from cowfs.plugins.dcp_storage import RANGE_GAP, coalesced

    g = RANGE_GAP
    items = [(3 * g, 100), (0, 10), (3 * g + 50, 10), (4 * g + 100, 1), (9 * g, 0)]  # the 4th: RANGE_GAP after
    assert coalesced(items) == [(0, 10), (3 * g, g + 101), (9 * g, 0)]
    assert coalesced([]) == []
