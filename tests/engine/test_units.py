"""One parser per kind of value: sizes and durations read the same everywhere."""
from __future__ import annotations

import pytest

from cowfs.errors import InvalidArgument
from cowfs.units import duration_ns, human_bytes, parse_duration, parse_size


@pytest.mark.parametrize("text, expected", [
    ("4194304", 4194304), ("64K", 64 << 10), ("64KiB", 64 << 10), ("256M", 256 << 20), ("256mb", 256 << 20),
    ("1G", 1 << 30), ("2T", 2 << 40),
])
def test_sizes(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "0", "-1M", "1.5G", "lots", "12X"])
def test_bad_sizes(text: str) -> None:
    with pytest.raises(InvalidArgument, match="size"):
        parse_size(text)


@pytest.mark.parametrize("text, seconds", [
    ("45", 45), ("2.5", 2.5), ("90s", 90), ("30m", 1800), ("12h", 43200), ("7d", 604800), ("2w", 1209600),
    ("1d12h", 129600), ("1h30m", 5400), (" 10M ", 600),
])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds
    assert duration_ns(text) == int(seconds * 1e9)


@pytest.mark.parametrize("text", ["", "soon", "0", "0s", "-5m", "m", "1x", "5m3", "1..5h", "inf", "nan"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(InvalidArgument, match="duration"):
        parse_duration(text)


def test_human_bytes() -> None:
    assert human_bytes(1000) == "1000 B"
    assert human_bytes(1536) == "1.5 KiB"
    assert human_bytes(3 << 30) == "3.0 GiB"
