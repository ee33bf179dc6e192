import random

from cowfs.store.data.chunking import MAX_CHUNK, MIN_CHUNK, StreamChunker, cut_all


def test_stream_equals_one_shot_whatever_the_piece_sizes():
    data = random.Random(1).randbytes(3 << 20)
    whole = cut_all(data)
    for piece in (1, 4096, 100_000, 1 << 20):
        s = StreamChunker()
        got: list[int] = []
        for i in range(0, len(data), piece * 37 if piece == 1 else piece):
            got += s.cut(data[i:i + (piece * 37 if piece == 1 else piece)]).sizes()
        got += s.cut([], final=True).sizes()
        assert got == [len(c) for c in whole]
    assert b"".join(whole) == data
    assert all(MIN_CHUNK <= len(c) <= MAX_CHUNK for c in whole[:-1])


def test_insertion_resynchronises():
    rnd = random.Random(2)
    data = rnd.randbytes(2 << 20)
    shifted = data[:500_000] + b"x" * 64 + data[500_000:]
    a, b = set(cut_all(data)), set(cut_all(shifted))
    shared = sum(len(c) for c in a & b)
    assert shared > len(data) * 0.85


def test_carry_is_bounded():
    s = StreamChunker()
    rnd = random.Random(3)
    for _ in range(20):
        s.cut(rnd.randbytes(1 << 20))
        assert s.carried <= MAX_CHUNK
