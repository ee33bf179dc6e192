"""The windowed file object of gets (cowfs/plugins/get.py, _WindowedBytes) against a model:
random seeks, reads and readintos over random wanted ranges and windows read what the file
holds, with a daemon played in-process that widens each range as the real one may; never
more than three windows are held or being got, and every memfd is given back at close. No
mount: `_fetch` is the fake daemon."""
from __future__ import annotations

import io
import os
import threading
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cowfs.plugins import get as get_mod


class _Daemon:
    """Answers gets of `data`: each range widened by up to `widen` bytes each side (as to
    whole chunks), ranges that then meet joined; counts the memfds out."""

    def __init__(self, data: bytes, widen: int) -> None:
        self.data, self.widen = data, widen
        self.out = 0
        self.most = 0
        self.lock = threading.Lock()

    def fetch(self, fd: int, what: str, kept: bool, ranges: list[tuple[int, int]] | None, gen: int | None) -> Any:
        assert ranges, "a windowed reader always names its ranges"
        widened: list[list[int]] = []
        for off, n in ranges:
            lo, hi = max(0, off - self.widen), min(len(self.data), off + n + self.widen)
            if hi <= lo:
                continue
            if widened and lo <= widened[-1][0] + widened[-1][1]:
                widened[-1][1] = max(widened[-1][0] + widened[-1][1], hi) - widened[-1][0]
            else:
                widened.append([lo, hi - lo])
        daemon = self

        class Memfd(io.BytesIO):
            def close(self) -> None:
                if not self.closed:
                    with daemon.lock:
                        daemon.out -= 1
                super().close()

        with self.lock:
            self.out += 1
            self.most = max(self.most, self.out)
        body = b"".join(self.data[o:o + n] for o, n in widened)
        return get_mod._Got(Memfd(body), len(self.data), widened, 7 if gen is None else gen, 3)


def _wanted(draw: Any, size: int) -> list[tuple[int, int]]:
    cuts = sorted(draw(st.sets(st.integers(0, size), max_size=12)))
    pairs = [(lo, hi - lo) for lo, hi in zip(cuts[::2], cuts[1::2]) if hi > lo]
    return pairs or [(0, size)]


@st.composite
def _cases(draw: Any) -> tuple[bytes, list[tuple[int, int]], int, int, list[tuple[str, int, int]]]:
    size = draw(st.integers(1, 3000))
    data = bytes(draw(st.binary(min_size=size, max_size=size)))
    wanted = _wanted(draw, size) if draw(st.booleans()) else [(0, size)]
    window = draw(st.integers(1, 700))
    widen = draw(st.integers(0, 64))
    ops = draw(st.lists(st.tuples(st.sampled_from(["read", "readinto", "readall"]), st.integers(0, size + 10),
                                  st.integers(-1, 900)), min_size=1, max_size=25))
    return data, wanted, window, widen, ops


@settings(max_examples=150, deadline=None)
@given(_cases())
def test_windowed_reads_read_the_file(case: tuple[bytes, list[tuple[int, int]], int, int, list[tuple[str, int, int]]],
                                      ) -> None:
    data, wanted, window, widen, ops = case
    daemon = _Daemon(data, widen)
    patch = pytest.MonkeyPatch()
    patch.setattr(get_mod, "WINDOW", window)
    patch.setattr(get_mod, "_fetch", daemon.fetch)
    fd = os.open("/dev/null", os.O_RDONLY)  # (never read: every byte comes from the fake daemon)
    try:
        f = get_mod._windowed(fd, "model", wanted, len(data))
        with f:
            for kind, pos, n in ops:
                f.seek(pos)
                if kind == "read":
                    assert f.read(n) == data[pos:pos + n if n >= 0 else None]
                elif kind == "readinto":
                    buf = bytearray(max(n, 0))
                    got = f.readinto(buf)
                    assert bytes(buf[:got]) == data[pos:pos + max(n, 0)]
                else:
                    assert f.read() == data[pos:]
                assert daemon.out <= 3, "more than three windows held or being got"
        assert daemon.out == 0 and daemon.most <= 4  # (a read outside the windows holds a fourth for a moment)
    finally:
        patch.undo()


def test_a_windowed_reader_that_fails_to_start_leaves_its_descriptor_to_its_opener(tmp_path, monkeypatch):
    """When the first get ahead fails, the object gives its descriptor up (open_read's
    handler closes it, once): collecting the object must not close that number again, which
    another file may hold by then."""
    import gc

    def fails(self: Any, i: int) -> None:
        raise OSError("the daemon went away")

    path = tmp_path / "f"
    path.write_bytes(b"x" * 100)
    fd = os.open(path, os.O_RDONLY)
    monkeypatch.setattr(get_mod._WindowedBytes, "_get_ahead", fails)
    try:
        with pytest.raises(OSError, match="went away"):
            get_mod._WindowedBytes(fd, "f", [[(0, 50)], [(50, 50)]], 100, None)
        gc.collect()  # the half-made object's finaliser runs close()
        os.fstat(fd)  # still open: the opener's to close
    finally:
        os.close(fd)
