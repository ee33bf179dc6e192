"""The write session's reorder window: writes a little ahead of the stream's end (the
kernel's writeback sends pages slightly out of order) wait until the gap before them is
written and then join the stream, so the file is still chunked while it is written;
anything the window cannot take (full, overlapping, a gap never filled, a read or a
truncate meanwhile) leaves the fast path with every byte intact."""
from __future__ import annotations

import os

import pytest

import cowfs.store.data.session as session_mod
from cowfs.store import ROOT_INO, Store

MiB = 1 << 20


def _pieces(n: int, size: int = MiB) -> list[bytes]:
    return [os.urandom(size) for _ in range(n)]


def _written(store: Store, name: bytes, order: list[int], pieces: list[bytes], size: int = MiB) -> tuple[bool, int, int]:
    """Write pieces[i] at i * size in `order`; (still streaming, bytes held, bytes streamed) after."""
    ino = store.create(ROOT_INO, name).ino
    with store.open_session(ino) as s:
        for i in order:
            assert s.write(i * size, pieces[i]) == size
        state = (s.streaming, s.ahead_len, s.stream_pos)
        s.commit()
    return state


def _content(store: Store, name: bytes) -> bytes:
    attr = store.lookup(ROOT_INO, name)
    with store.open_reader(attr.ino) as r:
        return bytes(r.read(0, attr.size + 1))


def test_swapped_pieces_stay_on_the_stream(store):
    pieces = _pieces(8)
    order = [1, 0, 3, 2, 5, 4, 7, 6]
    streaming, held, pos = _written(store, b"f", order, pieces)
    assert streaming and held == 0 and pos == 8 * MiB
    assert _content(store, b"f") == b"".join(pieces)


def test_pieces_far_out_of_order_fill_in_when_the_gap_closes(store):
    pieces = _pieces(10)
    order = [0, 5, 6, 7, 8, 9, 1, 2, 3, 4]  # five pieces held, then the gap fills
    streaming, held, pos = _written(store, b"f", order, pieces)
    assert streaming and held == 0 and pos == 10 * MiB
    assert _content(store, b"f") == b"".join(pieces)


def test_a_write_too_far_ahead_leaves_the_fast_path_with_every_byte(store, monkeypatch):
    monkeypatch.setattr(session_mod, "REORDER", 3 * MiB)
    pieces = _pieces(8)
    order = [0, 2, 3, 4, 5, 1, 6, 7]  # piece 4 ends 4 MiB past the stream's end (1 MiB)
    streaming, held, _pos = _written(store, b"f", order, pieces)
    assert not streaming and held == 0
    assert _content(store, b"f") == b"".join(pieces)


def test_a_write_over_a_held_one_is_held_newest_bytes_win(store):
    """The writeback cache sends a page at the file's end, then the same page again whole
    once more was written into it: the second write replaces the first in the window."""
    ino = store.create(ROOT_INO, b"f").ino
    a, b, c = os.urandom(MiB), os.urandom(MiB), os.urandom(MiB // 2)
    with store.open_session(ino) as s:
        s.write(0, a)
        s.write(2 * MiB, b)  # held
        s.write(2 * MiB + MiB // 4, c)  # over the held write
        assert s.streaming and s.ahead_len == MiB
        s.write(MiB, a)
        assert s.streaming and s.ahead_len == 0 and s.stream_pos == 3 * MiB
        s.commit()
    want = bytearray(a + a + b)
    want[2 * MiB + MiB // 4:2 * MiB + MiB // 4 + len(c)] = c
    assert _content(store, b"f") == bytes(want)


@pytest.mark.parametrize("then", ["commit", "read", "truncate"])
def test_a_gap_never_filled(store, then):
    """Held writes with a hole before them: a commit, a read or a truncate sees them in place
    (the hole reads as zeros)."""
    ino = store.create(ROOT_INO, b"f").ino
    a, b = os.urandom(MiB), os.urandom(MiB)
    want = a + bytes(MiB) + b
    with store.open_session(ino) as s:
        s.write(0, a)
        s.write(2 * MiB, b)
        assert s.streaming and s.ahead_len == MiB and s.size == 3 * MiB
        if then == "read":
            assert s.read(MiB - 10, MiB + 20) == want[MiB - 10:2 * MiB + 10]
        elif then == "truncate":
            s.truncate(2 * MiB + 100)
            want = want[:2 * MiB + 100]
        s.commit()
    assert _content(store, b"f") == want


def test_a_write_far_ahead_is_not_held(store):
    """A sparse or random write far past the stream's end goes to the overlay at once: it
    will not join the stream soon, and holding it would only cost memory."""
    ino = store.create(ROOT_INO, b"f").ino
    a, b = os.urandom(MiB), os.urandom(1000)
    with store.open_session(ino) as s:
        s.write(0, a)
        s.write(MiB + session_mod.REORDER, b)
        assert not s.streaming and s.ahead_len == 0
        s.commit()
    assert _content(store, b"f") == a + bytes(session_mod.REORDER) + b


def test_abort_drops_held_writes(store):
    ino = store.create(ROOT_INO, b"f").ino
    with store.open_session(ino) as s:
        s.write(0, b"x" * 1000)
        s.commit()
        s.write(5000, b"y" * 1000)  # beyond the stream's end: held
        assert s.ahead_len == 1000
        s.abort()
        assert s.ahead_len == 0 and s.size == 1000
        assert s.read(0, 10_000) == b"x" * 1000
    assert _content(store, b"f") == b"x" * 1000



@pytest.mark.parametrize("cover", ["whole", "part"])
def test_an_append_over_a_held_write_wins(store, cover):
    """A write held ahead of the stream, then an append that covers it (all of it, or its
    head): the append is the newer write, so its bytes are the file's (found by the model
    test: the held bytes came back on top after the session left the fast path)."""
    ino = store.create(ROOT_INO, b"f").ino
    old, new = b"o" * 1000, b"n" * (3000 if cover == "whole" else 1500)
    with store.open_session(ino) as s:
        s.write(1000, old)  # held: 1000..2000
        s.write(0, new)  # the stream reaches past it (or into it)
        want = new + (old[len(new) - 1000:] if cover == "part" else b"")
        assert s.read(0, 5000) == want  # a read leaves the fast path: the held bytes must not come back
        s.commit()
    assert _content(store, b"f") == want
    with store.open_session(ino) as s:
        s.write(1000, old)
        s.write(0, new)
        s.commit()  # no read in between: commit from the stream
    assert _content(store, b"f") == want


# -- what the writeback cache sends: a page again, a page late (reorder.py) ------------

def test_a_page_sent_again_stays_on_the_stream(store):
    """A write ends mid-page, the next one fills the page: the kernel sends the page once
    with the first write's bytes, then again whole. Its head repeats the stream's bytes: the
    rest is appended, nothing goes to the overlay."""
    data = os.urandom(3 * MiB)
    ino = store.create(ROOT_INO, b"f").ino
    with store.open_session(ino) as s:
        s.write(0, data[:5000])
        s.write(4096, data[4096:MiB + 100])  # page 1 again, then new bytes
        s.write(MiB, data[MiB:3 * MiB])  # the page again, its head a write before the last
        assert s.streaming and not s.overlay and s.stream_pos == 3 * MiB
        s.write(3 * MiB - 4096, data[3 * MiB - 4096:3 * MiB])  # the last page again, nothing new
        assert s.streaming and not s.overlay
        s.write(8192, data[8192:12288])  # further back than the stream's kept tail: a patch, the same bytes
        assert s.streaming and s.overlay
        s.commit()
    assert _content(store, b"f") == data


def test_a_page_sent_again_with_other_bytes_is_a_patch(store):
    """A write below the stream's end with other bytes is newer: a patch in the overlay on
    top of the stream, which goes on taking appends."""
    data = bytearray(os.urandom(2 * MiB))
    ino = store.create(ROOT_INO, b"f").ino
    with store.open_session(ino) as s:
        s.write(0, bytes(data[:5000]))
        data[4096:5000] = b"z" * 904
        s.write(4096, bytes(data[4096:MiB]))
        s.write(MiB, bytes(data[MiB:]))
        assert s.streaming and s.overlay and s.stream_pos == 2 * MiB
        assert s.read(4000, 2000) == data[4000:6000]
        s.commit()
    assert _content(store, b"f") == data


@pytest.mark.parametrize("base", [False, True])
@pytest.mark.parametrize("late", [False, True])
def test_the_stream_steps_over_a_small_gap_when_the_window_is_full(store, monkeypatch, base, late):
    """A page held back by the kernel (under writeback when it was dirtied again) while the
    pages after it fill the window: the stream steps over the gap (the committed version's
    bytes there, or zeros) and stays on the fast path; the page, when it comes, is a patch."""
    monkeypatch.setattr(session_mod, "REORDER", MiB)
    old, data = os.urandom(3 * MiB), os.urandom(3 * MiB)
    ino = store.create(ROOT_INO, b"f").ino
    if base:
        with store.open_session(ino) as s:
            s.write(0, old)
            s.commit()
    with store.open_session(ino) as s:
        s.write(0, data[:5000])
        for off in range(8192, 3 * MiB, 256 << 10):
            s.write(off, data[off:min(off + (256 << 10), 3 * MiB)])
        assert s.streaming and s.stream_pos > MiB
        want = data[:5000] + (old if base else bytes(8192))[5000:8192] + data[8192:]
        if late:
            s.write(4096, data[4096:8192])
            want = data
        assert s.streaming and s.read(0, 3 * MiB) == want
        s.commit()
    assert _content(store, b"f") == want


def test_a_patch_stays_on_top_when_the_session_leaves_the_fast_path(store, monkeypatch):
    """Patches below the stream's end are newer than the stream's bytes still in memory:
    when a truncate makes the session leave the fast path, those go under the patches."""
    monkeypatch.setattr(session_mod, "BATCH", 64 << 30)  # keep every byte in memory
    data = bytearray(os.urandom(3 * MiB))
    ino = store.create(ROOT_INO, b"f").ino
    with store.open_session(ino) as s:
        s.write(0, bytes(data))
        s.write(100, b"p" * 1000)
        data[100:1100] = b"p" * 1000
        assert s.streaming and s.overlay
        s.truncate(2 * MiB)
        assert not s.streaming
        s.commit()
    assert _content(store, b"f") == data[:2 * MiB]


@pytest.mark.parametrize("then", ["commit", "read"])
def test_a_small_gap_never_filled_is_stepped_over_not_spilled(store, monkeypatch, then):
    """A held write with a gap of at most HOLE before it, never filled: a commit or a read
    steps over the gap (the view's bytes: zeros here) and the session stays on the stream:
    it never freezes."""
    def no_freeze(self):  # type: ignore[no-untyped-def]
        raise AssertionError("the session left the stream")

    monkeypatch.setattr(session_mod.WriteSession, "_freeze", no_freeze)
    data = os.urandom(3 * MiB)
    want = data[:5000] + bytes(8192 - 5000) + data[8192:]
    ino = store.create(ROOT_INO, b"f").ino
    with store.open_session(ino) as s:
        s.write(0, data[:5000])
        s.write(8192, data[8192:])
        assert s.streaming and s.ahead_len == len(data) - 8192
        if then == "read":
            assert s.read(4000, 5000) == want[4000:9000]
            assert s.streaming and s.ahead_len == 0 and not s.overlay
        s.commit()
    assert _content(store, b"f") == want
