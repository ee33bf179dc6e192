"""spans.py (gets of ranges) against a reference, model-based: random versions of chunks and
holes, random ranges; the widened ranges hold the ranges asked for and end at chunk ends or
inside holes, and reading the spans plus the zero-filled parts gives the version's bytes of
the widened ranges back to back."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cowfs.store.data.content import Extent
from cowfs.store.data.spans import range_spans, widen, zero_fill


@st.composite
def versions(draw: st.DrawFn) -> tuple[list[Extent], bytes]:
    extents, data, pos = [], bytearray(), 0
    for k in range(draw(st.integers(0, 12))):
        n = draw(st.integers(1, 300))
        hole = draw(st.booleans())
        extents.append(Extent(pos, n, None if hole else k.to_bytes(32, "little"), None))
        data += bytes(n) if hole else bytes([k + 1]) * n
        pos += n
    return extents, bytes(data)


@st.composite
def asked(draw: st.DrawFn, size: int) -> list[tuple[int, int]]:
    points = sorted(set(draw(st.lists(st.integers(0, size + 50), max_size=10))))
    return [(lo, hi) for lo, hi in zip(points[::2], points[1::2]) if hi > lo]


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_spans_give_the_bytes_of_the_widened_ranges(data: st.DataObject) -> None:
    extents, content = data.draw(versions())
    size = len(content)
    ranges = data.draw(asked(size))
    starts = [e.offset for e in extents]
    ends = {e.end for e in extents}
    wide = widen(extents, starts, size, ranges)
    for lo, hi in ranges:  # every byte asked for (within the version) is in a widened range
        if lo < size:
            assert any(a <= lo and min(hi, size) <= b for a, b in wide)
    for a, b in wide:
        assert 0 <= a < b <= size
    assert all(wide[i][1] < wide[i + 1][0] for i in range(len(wide) - 1))
    need = sum(b - a for a, b in wide)
    dest = memoryview(bytearray(b"\xee" * need))  # old bytes (a kept memfd's)
    spans = range_spans(extents, starts, size, ends, wide, 100, lambda lo, hi: zero_fill(dest, lo, hi))
    for lo, hi, d in spans:
        assert lo in starts and (hi == size or hi in ends)
        dest[d:d + hi - lo] = content[lo:hi]  # what read_window puts there (holes as zeros)
    assert bytes(dest) == b"".join(content[a:b] for a, b in wide)


def test_a_range_ending_inside_a_chunk_is_refused() -> None:
    extents = [Extent(0, 10, b"a" * 32, None), Extent(10, 10, b"b" * 32, None)]
    with pytest.raises(ValueError, match="inside a chunk"):
        range_spans(extents, [0, 10], 20, {10, 20}, [(0, 5)], 100, lambda lo, hi: None)


def test_zero_fill_in_pieces() -> None:
    buf = memoryview(bytearray(b"\x01" * (3 << 20)))
    zero_fill(buf, 5, (3 << 20) - 5)
    assert bytes(buf[:5]) == b"\x01" * 5 and not any(buf[5:(3 << 20) - 5]) and bytes(buf[-5:]) == b"\x01" * 5
