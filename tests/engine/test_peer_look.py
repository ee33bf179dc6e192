"""How often a producer lists its prefix's stores (fs/namespace_clock.py): every PEER_LOOK
seconds while it has peers; alone, twice as long each time, up to PEER_LOOK_ALONE."""
from __future__ import annotations

from cowfs.fs.namespace_clock import PEER_LOOK, PEER_LOOK_ALONE, next_look


def test_alone_the_looks_back_off_and_a_peer_brings_them_back():
    delays, delay = [], PEER_LOOK / 2
    for _ in range(8):
        delay = next_look(delay, 0)
        delays.append(delay)
    assert delays == [3.0, 6.0, 12.0, 24.0, 48.0, 48.0, 48.0, 48.0] and PEER_LOOK_ALONE == 48.0
    assert next_look(delay, 1) == PEER_LOOK == 3.0
    assert next_look(PEER_LOOK, 5) == PEER_LOOK
