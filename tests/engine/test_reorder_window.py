"""The reorder window and the stream's tail (store/data/reorder.py) against a plain model:
held writes that overlap keep the newest bytes, join the stream in order, and the tail tells
a write that repeats the stream's last bytes from one that does not."""
from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from cowfs.store.data.reorder import ReorderWindow, StreamTail


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 30))
def test_held_writes_join_with_the_newest_bytes(seed: int, n: int) -> None:
    rng = random.Random(seed)
    start, limit = 100, 4000
    window, model = ReorderWindow(), {}
    for k in range(n):
        off = rng.randrange(start + 1, start + limit - 1)
        data = bytes([k % 251 + 1]) * rng.randrange(1, min(600, start + limit - off) + 1)
        assert window.hold(off, data, start, limit)
        for i, b in enumerate(data):
            model[off + i] = b
    assert window.held == len(model)  # held writes never overlap
    assert not window.hold(start + limit, b"x", start, limit)  # ends past the limit
    # the stream reaches each held write in turn; a gap before one is filled with zeros here
    pos, stream = start, {}
    while window:
        if window.first() > pos:
            pos = window.first()
        rest = window.reached(pos)
        assert rest is not None
        for i, b in enumerate(bytes(rest)):
            stream[pos + i] = b
        pos += len(rest)
        window.pop_first()
    assert stream == model and window.held == 0


def test_a_write_over_held_ones_keeps_their_bytes_outside_it() -> None:
    window = ReorderWindow()
    assert window.hold(10, b"a" * 10, 0, 100)
    assert window.hold(30, b"b" * 10, 0, 100)
    assert window.hold(15, b"c" * 20, 0, 100)  # over the end of the first and the start of the second
    assert [(o, bytes(d)) for o, d in window.items()] == [(10, b"aaaaa"), (15, b"c" * 20), (35, b"bbbbb")]
    assert window.held == 30


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(1, 5000), min_size=1, max_size=12), seed=st.integers(0, 2**32 - 1))
def test_the_tail_knows_the_streams_last_bytes(sizes: list[int], seed: int) -> None:
    rng = random.Random(seed)
    keep = 4096
    tail, stream = StreamTail(keep), b""
    for n in sizes:
        data = rng.randbytes(n)
        tail.push(data)
        stream += data
    for _ in range(30):
        back = rng.randrange(1, len(stream) + 1)
        n = rng.randrange(1, back + 10)
        same = stream[len(stream) - back:len(stream) - back + n]
        if back <= keep:  # at least `keep` bytes are kept
            assert tail.same(back, same + b"z" * (n - len(same)))
            if same:
                other = bytes([same[0] ^ 1]) + same[1:]
                assert not tail.same(back, other + b"z" * (n - len(same)))
    assert not tail.same(len(stream) + 1, b"x")
    assert not tail.same(0, b"x")
