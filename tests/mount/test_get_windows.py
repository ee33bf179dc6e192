"""Gets a window at a time (cowfs/plugins/get.py, cowfs/fs/get_op.py): a copying reader of a
file larger than WINDOW gets it in windows of at most WINDOW bytes, one memfd held at a time;
every get after the first asks for the generation the first one read, so all of them read
one version while a writer commits another; `gen` that is malformed, past the store's newest
or not a snapshot's own is EINVAL, a version that did not exist at it ESTALE; a window the
daemon has no memory for is read through the mount; a reply of another version fails the
read with ESTALE; a DCP load of several files gets each once, the next one ahead. WINDOW is
made a few MiB here."""
from __future__ import annotations

import errno
import os
import random
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from hypothesis import given
from hypothesis import strategies as st

import cowfs.dcp
import cowfs.plugins.dcp_storage
from cowfs.plugins import get as get_mod
from cowfs.plugins.bulk import BulkRefused, daemon_socket, request
from cowfs.plugins.get import open_read
from cowfs.plugins.part_memfds import PartMemfds
from tests.support.mountutil import cowfs as cowfs_cli
from tests.support.mountutil import mounted

pytestmark = pytest.mark.mount
MIB = 1 << 20
WINDOW = 3 * MIB


@pytest.fixture
def gets(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, int]]:
    """WINDOW at 3 MiB, a pool of memfds of the test's own, and every get's (ranges, bytes held)."""
    monkeypatch.setattr(get_mod, "WINDOW", WINDOW)
    pool = PartMemfds(keep=64 * MIB)
    monkeypatch.setattr(get_mod, "part_memfds", lambda: pool)
    seen: list[tuple[Any, int]] = []
    real_get = get_mod._get

    def noting(sock, fd, what, kept, ranges, gen):  # type: ignore[no-untyped-def]
        got = real_get(sock, fd, what, kept, ranges, gen)
        if got is not None:
            seen.append((ranges, sum(n for _o, n in got.ranges) if got.ranges is not None else got.size))
        return got

    monkeypatch.setattr(get_mod, "_get", noting)
    return seen


def _content(seed: int) -> bytes:
    rng = random.Random(seed)
    return rng.randbytes(7 * MIB) + bytes(2 * MIB) + rng.randbytes(4 * MIB + 999)


def test_a_large_file_is_got_a_window_at_a_time(store_path: Path, tmp_path: Path,
                                                gets: list[tuple[Any, int]]) -> None:
    content = _content(1)
    with mounted(store_path, tmp_path / "m") as mnt:
        (mnt / "f").write_bytes(content)
        (mnt / "small").write_bytes(b"abc" * 1000)
        with open_read(mnt / "small", kept=True) as f:  # below WINDOW: one whole get, as before
            assert not isinstance(f, get_mod._WindowedBytes) and f.read() == b"abc" * 1000
        gets.clear()
        with open_read(mnt / "f", kept=True) as f:
            assert isinstance(f, get_mod._WindowedBytes)
            assert f.read() == content
            assert len(gets) == -(-len(content) // WINDOW)  # one get per window, in order
            assert all(held <= WINDOW + 2 * get_mod.WIDENED for _r, held in gets)
            rng = random.Random(2)
            for _ in range(40):  # back and forth across the windows
                off = rng.randrange(len(content))
                n = rng.choice([1, 4096, MIB, 5 * MIB])
                f.seek(off)
                assert f.read(n) == content[off:off + n]
                buf = bytearray(n)
                f.seek(off)
                assert f.readinto(buf) == min(n, len(content) - off)
                assert bytes(buf[:min(n, len(content) - off)]) == content[off:off + n]
        assert get_mod.part_memfds().owned <= 3 * (WINDOW + 2 * get_mod.WIDENED)  # three windows held at most
        gets.clear()
        with open_read(mnt / "f", kept=True) as f:  # an item across a border, read as torch.load does
            for off, n in ((2 * WINDOW - 100, 200), (2 * WINDOW - 1000, 10), (2 * WINDOW - 1000, 5000),
                           (2 * WINDOW + 4000, 10), (2 * WINDOW - 10, 20)):
                f.seek(off)
                assert f.read(n) == content[off:off + n]
        got = [r for r, _held in gets]  # (after close: a window got ahead is done by then)
        assert got == [[(k * WINDOW, WINDOW)] for k in range(4)]  # 0, 1, 2 and 3 got ahead: none twice


def test_windows_read_one_version_while_a_writer_commits_another(store_path: Path, tmp_path: Path,
                                                                 gets: list[tuple[Any, int]]) -> None:
    old, new = _content(3), _content(4)
    with mounted(store_path, tmp_path / "m") as mnt:
        (mnt / "f").write_bytes(old)
        with open_read(mnt / "f", kept=True) as f:
            assert f.read(MIB) == old[:MIB]  # the first window got
            (mnt / "f").write_bytes(new)  # a new version committed, in place
            (mnt / "g").write_bytes(new)
            os.replace(mnt / "g", mnt / "f")  # and the name given to another file
            assert f.read() == old[MIB:]  # the later windows: the first window's version
            f.seek(0)
            assert f.read() == old
        assert (mnt / "f").read_bytes() == new


def test_a_window_the_daemon_has_no_memory_for_is_read_through_the_mount(
        store_path: Path, tmp_path: Path, gets: list[tuple[Any, int]], monkeypatch: pytest.MonkeyPatch) -> None:
    content = _content(5)
    counted = get_mod._get
    calls = []

    def second_refused(*args: Any) -> Any:
        calls.append(1)
        return None if len(calls) == 2 else counted(*args)

    monkeypatch.setattr(get_mod, "_get", second_refused)
    with mounted(store_path, tmp_path / "m") as mnt:
        (mnt / "f").write_bytes(content)
        with open_read(mnt / "f", kept=True) as f:
            assert f.read() == content
        assert len(calls) == -(-len(content) // WINDOW) and len(gets) == len(calls) - 1


def test_a_window_of_another_version_fails_the_read(store_path: Path, tmp_path: Path,
                                                    gets: list[tuple[Any, int]],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """What a daemon from before generations does when a writer commits between two windows."""
    content = _content(6)
    counted = get_mod._get

    def another_version(*args: Any) -> Any:
        got = counted(*args)
        return got._replace(vid=got.vid + 1) if len(gets) == 2 else got

    monkeypatch.setattr(get_mod, "_get", another_version)
    with mounted(store_path, tmp_path / "m") as mnt:
        (mnt / "f").write_bytes(content)
        with open_read(mnt / "f", kept=True) as f:
            assert f.read(WINDOW) == content[:WINDOW]
            with pytest.raises(OSError) as err:
                f.read(WINDOW)
            assert err.value.errno == errno.ESTALE and "changed while it was read" in str(err.value)
        assert get_mod.part_memfds().free >= 1  # the refused window's memfd went back


def test_dcp_and_copying_loads_read_a_large_file_in_windows(store_path: Path, tmp_path: Path,
                                                  gets: list[tuple[Any, int]]) -> None:
    torch.manual_seed(5)
    state = {f"w{i}": torch.randn(512, 1024) for i in range(12)}  # 2 MiB each, one 24 MiB .distcp
    with mounted(store_path, tmp_path / "m") as mnt:
        dcp.save(state, storage_writer=cowfs.dcp.Writer(mnt / "ckpt"), no_dist=True)
        gets.clear()
        back = {k: torch.zeros_like(v) for k, v in state.items()}
        dcp.load(back, storage_reader=cowfs.dcp.Reader(mnt / "ckpt"), no_dist=True)
        assert all(torch.equal(back[k], v) for k, v in state.items())
        windows = [str(r) for r, _held in gets if r is not None]
        assert len(windows) >= 8 and all(held <= WINDOW + 2 * get_mod.WIDENED for _r, held in gets)
        assert len(set(windows)) == len(windows)  # items read in the order they lie: no window got twice
        torch.save(state, mnt / "state.pt")
        gets.clear()
        loaded = cowfs.load(mnt / "state.pt", mmap=False)  # a copying torch.load: windows too
        assert all(torch.equal(loaded[k], v) for k, v in state.items()) and len(gets) >= 4


def _ask(mnt: Path, name: str, header: dict[str, Any]) -> dict[str, Any]:
    fd = os.open(mnt / name, os.O_RDONLY)
    try:
        sock = daemon_socket(fd)
        assert sock is not None
        with sock:
            result, fds = request(sock, {"op": "get", "fd": fd, **header}, [], name)
        for extra in fds:
            os.close(extra)
        return dict(result)
    finally:
        os.close(fd)


def test_gen_is_checked(store_path: Path, tmp_path: Path) -> None:
    with mounted(store_path, tmp_path / "m") as mnt:
        (mnt / "f").write_bytes(b"one")
        first = _ask(mnt, "f", {})
        (mnt / "f").write_bytes(b"two, longer")
        assert _ask(mnt, "f", {"gen": first["gen"]})["size"] == 3  # the version at that generation
        assert _ask(mnt, "f", {})["size"] == 11
        for bad in (-1, "7", True, 1.5):
            with pytest.raises(BulkRefused) as err:
                _ask(mnt, "f", {"gen": bad})
            assert err.value.errno == errno.EINVAL and "gen" in str(err.value), bad
        with pytest.raises(BulkRefused) as err:
            _ask(mnt, "f", {"gen": 10 ** 9})
        assert err.value.errno == errno.EINVAL and "past this store's newest" in str(err.value)
        with pytest.raises(BulkRefused) as err:  # the file did not exist yet at generation 1
            _ask(mnt, "f", {"gen": 1})
        assert err.value.errno == errno.ESTALE and "is gone" in str(err.value)
        cowfs_cli("snapshot", "create", str(mnt), "s1")
        snap = _ask(mnt, ".snapshots/s1/f", {})
        assert _ask(mnt, ".snapshots/s1/f", {"gen": snap["gen"]})["size"] == 11
        with pytest.raises(BulkRefused) as err:
            _ask(mnt, ".snapshots/s1/f", {"gen": first["gen"]})
        assert err.value.errno == errno.EINVAL and "snapshot" in str(err.value)


@given(st.lists(st.tuples(st.integers(0, 40), st.integers(1, 30)), max_size=30), st.integers(1, 20),
       st.integers(1, 5))
def test_windows_tile_the_ranges(raw: list[tuple[int, int]], window: int, most: int) -> None:
    ranges, at = [], 0
    for gap, n in raw:  # sorted and apart
        ranges.append((at + gap, n))
        at += gap + n + 1
    old = (get_mod.WINDOW, get_mod.MAX_SENT)
    get_mod.WINDOW, get_mod.MAX_SENT = window, most
    try:
        windows = get_mod._windows(ranges)
    finally:
        get_mod.WINDOW, get_mod.MAX_SENT = old
    assert all(w and sum(n for _o, n in w) <= window and len(w) <= most for w in windows)
    flat = [r for w in windows for r in w]
    assert all(flat[i][0] + flat[i][1] <= flat[i + 1][0] for i in range(len(flat) - 1))
    covered = {b for o, n in flat for b in range(o, o + n)}
    assert covered == {b for o, n in ranges for b in range(o, o + n)}
    assert all(sum(n for _o, n in w) == window or len(w) == most for w in windows[:-1])  # filled in order


def test_a_dcp_load_of_several_files_gets_each_once_the_next_ahead(store_path: Path, tmp_path: Path,
                                                                    gets: list[tuple[Any, int]],
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(6)
    state = {f"w{i:02d}": torch.randn(256, 1024) for i in range(12)}  # 1 MiB each, in 4 files
    opened: list[str] = []
    threads: list[str] = []
    real_open = get_mod.open_read

    def noting(path, kept=False, ranges=None):  # type: ignore[no-untyped-def]
        if str(path).endswith(".distcp"):
            opened.append(os.path.basename(path))
            threads.append(threading.current_thread().name)
        return real_open(path, kept, ranges)

    monkeypatch.setattr(cowfs.plugins.dcp_storage, "open_read", noting)
    with mounted(store_path, tmp_path / "m") as mnt:
        dcp.save(state, storage_writer=cowfs.dcp.Writer(mnt / "ckpt", thread_count=4), no_dist=True)
        files = sorted(p.name for p in (mnt / "ckpt").glob("*.distcp"))
        assert len(files) == 4
        reader = cowfs.dcp.Reader(mnt / "ckpt")
        back = {k: torch.zeros_like(v) for k, v in state.items()}
        opened.clear()
        dcp.load(back, storage_reader=reader, no_dist=True)
        assert all(torch.equal(back[k], v) for k, v in state.items())
        assert opened == files and reader.fs._ahead is None  # each once, in order; none left got ahead
        assert threads[0] == "MainThread" and all(t.startswith("cowfs-dcp-ahead") for t in threads[1:]), threads
        model_only = {k: torch.zeros_like(v) for k, v in state.items() if k < "w03"}
        opened.clear()
        dcp.load(model_only, storage_reader=reader, no_dist=True)  # the files that hold these only
        assert all(torch.equal(model_only[k], state[k]) for k in model_only)
        assert len(opened) == len(set(opened)) < 4 and reader.fs._ahead is None
        for _ in range(3):  # a Reader per load, as an evaluation loop makes: no get-ahead thread stays
            dcp.load(back, storage_reader=cowfs.dcp.Reader(mnt / "ckpt"), no_dist=True)
        assert not [t for t in threading.enumerate() if t.name.startswith("cowfs-dcp-ahead")]
