"""Storage schemes for a series of n versions, computed from measured piece sizes.

Inputs (bytes summed over a version's tensor pieces, one codec):
  whole[i]     version i coded on its own;
  delta[i, j]  version i coded as a delta against version j (for XOR, delta[i, j] ==
               delta[j, i]: the same bytes);
  tensor[i]    version i's tensor bytes raw (for "newest left raw");
  rest[i]      everything else of version i as stored (headers, small files);
  logical[i]   the size of version i's files.
Versions are 0 (oldest) .. n-1 (newest). The newest is always stored whole. `reads` is the
most pieces one piece read touches (1 = whole, 2 = one delta + its base, ...); `reencodes`
is how many older versions compaction must re-encode when a new checkpoint arrives.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Layout:
    scheme: str
    param: int  # K: keyframe distance or group size (0 when not parametrised)
    base: list[int | None]  # base[i] = version i is a delta against, None = whole
    reads: int
    reencodes: int


def reverse_chain(n: int, k: int) -> Layout:
    """Newest whole; every other version a delta against the next newer one, except
    keyframes (whole) at i % k == k-1, so a read touches at most k pieces."""
    base = [None if (i % k == k - 1 or i == n - 1) else i + 1 for i in range(n)]
    return Layout("reverse chain, keyframe every K", k, base, k, 1)


def reverse_star(n: int, k: int) -> Layout:
    """Groups of k; the group's newest version (the hub) whole, the others deltas against
    it. While a group is open its hub is the newest checkpoint, so each arrival re-encodes
    the open group's members against the new hub."""
    hubs = [i for i in range(n) if i % k == k - 1 or i == n - 1]
    base = [None if i in hubs else min(h for h in hubs if h > i) for i in range(n)]
    return Layout("reverse star, group of K", k, base, 2, k - 1)


def forward_star(n: int, k: int) -> Layout:
    """Groups of k; the group's oldest version (the hub) whole, the others deltas against
    it; the newest stays whole until the next checkpoint arrives, then becomes a delta."""
    base = [None if (i % k == 0 or i == n - 1) else i - i % k for i in range(n)]
    return Layout("forward star, group of K", k, base, 2, 1)


def star_on_newest(n: int) -> Layout:
    base = [None if i == n - 1 else n - 1 for i in range(n)]
    return Layout("star on newest", 0, base, 2, n - 1)


def unbounded_chain(n: int) -> Layout:
    base = [None if i == n - 1 else i + 1 for i in range(n)]
    return Layout("reverse chain, unbounded", 0, base, n, 1)


def all_whole(n: int) -> Layout:
    return Layout("every version whole", 0, [None] * n, 1, 0)


def layouts(n: int, bounds: tuple[int, ...] = (2, 3, 4, 5)) -> list[Layout]:
    out = [all_whole(n)]
    for k in bounds:
        out.append(reverse_chain(n, k))
    for k in bounds:
        out.append(reverse_star(n, k))
    for k in bounds:
        out.append(forward_star(n, k))
    out += [star_on_newest(n), unbounded_chain(n)]
    return out


def needed_pairs(n: int, bounds: tuple[int, ...] = (2, 3, 4, 5)) -> set[tuple[int, int]]:
    """The (target, base) deltas the layouts need, plus every (i, i-1) forward delta."""
    pairs = {(i, i - 1) for i in range(1, n)}
    for lay in layouts(n, bounds):
        pairs |= {(i, b) for i, b in enumerate(lay.base) if b is not None}
    return pairs


def stored(layout: Layout, whole: list[int], delta: dict[tuple[int, int], int], tensor: list[int],
           rest: list[int], newest_raw: bool = False) -> int:
    n = len(whole)
    total = sum(rest)
    for i, b in enumerate(layout.base):
        if b is None:
            total += tensor[i] if (newest_raw and i == n - 1) else whole[i]
        else:
            total += delta[(i, b)]
    return total


def evaluate(whole: list[int], delta: dict[tuple[int, int], int], tensor: list[int], rest: list[int],
             logical: list[int], bounds: tuple[int, ...] = (2, 3, 4, 5)) -> list[dict[str, object]]:
    n = len(whole)
    rows = []
    for lay in layouts(n, bounds):
        row: dict[str, object] = {"scheme": lay.scheme, "K": lay.param, "reads": lay.reads,
                                  "reencodes": lay.reencodes,
                                  "wholes": sum(b is None for b in lay.base)}
        try:
            row["ratio"] = stored(lay, whole, delta, tensor, rest) / sum(logical)
            row["ratio_newest_raw"] = stored(lay, whole, delta, tensor, rest, True) / sum(logical)
        except KeyError as missing:
            row["ratio"] = row["ratio_newest_raw"] = None
            row["missing"] = str(missing)
        rows.append(row)
    return rows


def markdown(rows: list[dict[str, object]]) -> str:
    lines = ["| scheme | K | wholes | max pieces per read | re-encodes per checkpoint | stored/logical "
             "| same, newest left raw |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.3f}"
        raw = "-" if r["ratio_newest_raw"] is None else f"{r['ratio_newest_raw']:.3f}"
        lines.append(f"| {r['scheme']} | {r['K'] or '-'} | {r['wholes']} | {r['reads']} | {r['reencodes']} "
                     f"| {ratio} | {raw} |")
    return "\n".join(lines)
