"""Which version is stored as a delta against which: the stored size of each layout,
computed from measured per-piece sizes.

Versions are 0 (oldest) .. n-1 (newest). For one coder, per version and piece:
  whole[v]       stored bytes of the piece coded on its own (raw if that is not smaller);
  delta[t][v]    (v < n-1) stored bytes of the piece coded as transform t against the same
                 piece of version v+1, including the 32-byte base id; the whole size where
                 v+1 has no such piece;
  dup[v]         the same bytes are stored elsewhere (global dedup): costs 0.
Every delta is kept only where it is smaller than the whole piece (the engine's
encode_delta makes the same choice), so no layout costs more than all-whole.

Layouts:
  whole           every version whole (byte-grouped compression only);
  forward xor     the oldest whole, each later version an XOR against the one before (the
                  prototype in issue 14; the newest is at the end of the longest chain);
  reverse K       the engine's scheme: the newest whole, each older version a delta against
                  the next newer one, and a whole keyframe at every version v with
                  v % K == K-1, so a read of one piece touches at most K pieces (itself and
                  up to K-1 bases); when a checkpoint arrives, only the previous newest is
                  re-encoded (as a delta against it, unless it is a keyframe).
                  K = 0: no keyframes (a read of the oldest touches n pieces).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Sizes:
    whole: list[np.ndarray]
    delta: dict[str, list[np.ndarray]]
    dup: list[np.ndarray]
    forward_map: list[np.ndarray]  # [v] for v >= 1: index in v-1 of each piece of v, -1 if none


def reverse(s: Sizes, transform: str, k: int) -> list[np.ndarray]:
    """Per version and piece, its cost in the reverse chain with a keyframe every k (0: none)."""
    n = len(s.whole)
    out = []
    for v in range(n):
        w = s.whole[v]
        keyframe = v == n - 1 or (k > 0 and v % k == k - 1)
        cost = w if keyframe else np.minimum(s.delta[transform][v], w)
        out.append(np.where(s.dup[v], 0, cost))
    return out


def forward_xor(s: Sizes) -> list[np.ndarray]:
    """Per version and piece, its cost when each version is an XOR against the previous one:
    the XOR of v against v-1 is the XOR of v-1 against v, measured once."""
    out = [np.where(s.dup[0], 0, s.whole[0])]
    for v in range(1, len(s.whole)):
        w = s.whole[v]
        m = s.forward_map[v]
        d = np.where(m >= 0, s.delta["xor"][v - 1][np.maximum(m, 0)], w)
        out.append(np.where(s.dup[v], 0, np.minimum(d, w)))
    return out


def all_whole(s: Sizes) -> list[np.ndarray]:
    return [np.where(d, 0, w) for w, d in zip(s.whole, s.dup)]


def wholes(n: int, k: int) -> int:
    """How many versions of n the reverse chain stores whole."""
    return sum(1 for v in range(n) if v == n - 1 or (k > 0 and v % k == k - 1))


def layouts(s: Sizes, ks: tuple[int, ...]) -> dict[str, list[np.ndarray]]:
    """Every layout measured for this coder: name -> per version, per piece cost."""
    out = {"whole": all_whole(s)}
    if "xor" in s.delta:
        out["forward xor"] = forward_xor(s)
    for t in s.delta:
        for k in ks:
            out[f"reverse {t} K={k or 'inf'}"] = reverse(s, t, k)
    return out
