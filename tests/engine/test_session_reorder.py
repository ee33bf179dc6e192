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


def test_an_overlapping_write_leaves_the_fast_path_newest_bytes_win(store):
    ino = store.create(ROOT_INO, b"f").ino
    a, b, c = os.urandom(MiB), os.urandom(MiB), os.urandom(MiB // 2)
    with store.open_session(ino) as s:
        s.write(0, a)
        s.write(2 * MiB, b)  # held
        s.write(2 * MiB + MiB // 4, c)  # over the held write
        assert not s.streaming and s.ahead_len == 0
        s.write(MiB, a)
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
