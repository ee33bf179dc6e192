"""One parser (and one printer) per kind of value the CLI and the mount options take.

Sizes: '256M', '1G', '64KiB', '4194304' (binary units, a bare number is bytes).
Durations: '90s', '30m', '12h', '7d', '2w', combinations like '1d12h', a bare
number is seconds. The auto-snapshot interval, --keep-within and
--keep-history are all durations.
"""
from __future__ import annotations

from .errors import InvalidArgument

SIZE_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_size(text: str) -> int:
    """'256M', '1G', '4194304', '64KiB' -> bytes (positive)."""
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    mult = 1
    if t and t[-1] in SIZE_UNITS:
        mult = SIZE_UNITS[t[-1]]
        t = t[:-1]
    try:
        value = int(t)
    except ValueError:
        raise InvalidArgument(f"not a size: {text!r} (use e.g. 256M, 1G)") from None
    if value <= 0:
        raise InvalidArgument(f"size must be positive: {text!r}")
    return value * mult


def parse_duration(text: str) -> float:
    """'90s', '30m', '12h', '7d', '2w', '1d12h', '45' (seconds) -> seconds (positive)."""
    t = text.strip().lower()
    bad = InvalidArgument(f"not a duration: {text!r} (use e.g. 30s, 10m, 12h, 7d, 1d12h)")
    try:
        return _positive(float(t), bad)  # a bare number: seconds
    except ValueError:
        pass
    total, num = 0.0, ""
    for ch in t:
        if ch.isdigit() or ch == ".":
            num += ch
        elif ch in DURATION_UNITS and num:
            try:
                total += float(num) * DURATION_UNITS[ch]
            except ValueError:
                raise bad from None
            num = ""
        else:
            raise bad
    if num:
        raise bad
    return _positive(total, bad)


def duration_ns(text: str) -> int:
    return int(parse_duration(text) * 1e9)


def _positive(value: float, bad: InvalidArgument) -> float:
    if not value > 0 or value == float("inf"):
        raise bad
    return value


def human_duration(seconds: float) -> str:
    """3600 -> "1h", 5400 -> "1h30m", 2.5 -> "2.5s" (what parse_duration reads back)."""
    if seconds != int(seconds) or seconds < 60:
        return f"{seconds:g}s"
    out, rest = "", int(seconds)
    for unit in ("d", "h", "m", "s"):
        n, rest = divmod(rest, DURATION_UNITS[unit])
        out += f"{n}{unit}" if n else ""
    return out


def human_bytes(n: float) -> str:
    """1536 -> "1.5 KiB" (the CLI's and the harnesses' way of showing sizes)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)
