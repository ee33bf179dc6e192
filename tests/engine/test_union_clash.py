"""The clash rule on a node's own mount (fs/union_clash.py, PeerWins): between the store and
the other stores' winner, the later change (by the stores' Lamport generations) shows; two
directories merge; the store's own change at a path (or above it) takes it back at once."""
from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from cowfs.fs.union_clash import PeerWins
from cowfs.remote.merge import fresh
from cowfs.remote.state import RemoteState
from cowfs.store import ROOT_INO, Store
from cowfs.store.log.layout import CATALOG_FILE
from tests.support.storeutil import assert_clean, new_store


@pytest.fixture
def node_and_peer(tmp_path):
    paths = [new_store(tmp_path / n) for n in ("own", "peer")]
    own, peer = (Store.open(p) for p in paths)
    RemoteState(tmp_path / "remote.db", "s3://b/p").close()
    merged = fresh(tmp_path / "union.db", tmp_path / "remote.db")
    source = SimpleNamespace(write_lock=threading.Lock(), merged=merged)

    def peer_step() -> None:  # the peer's catalog merged whole, as a consumer's step brings it
        merged.step(peer.config.store_uuid, paths[1] / CATALOG_FILE, 0, peer.generation, None)

    wins = PeerWins(own, source)  # type: ignore[arg-type]
    yield own, peer, peer_step, wins
    wins.close()
    merged.close()
    own.close()
    peer.close()
    for p in paths:
        assert_clean(p)


def test_the_later_change_shows_and_the_stores_own_change_takes_it_back(node_and_peer):
    own, peer, peer_step, wins = node_and_peer
    for s in (own, peer):
        s.mkdir(ROOT_INO, b"run")
    own.write_file("/run/latest", b"own 1")
    peer.observe_generation(own.generation)  # the peer saw it: its write is later
    peer.write_file("/run/latest", b"peer 1")
    peer.write_file("/run/only-theirs", b"x")
    peer_step()
    assert wins.look(["/run", "/run/latest", "/run/only-theirs"]) == {"/run/latest"}
    assert "/run/latest" in wins and "/run" not in wins and "/run/only-theirs" not in wins  # dirs merge
    assert wins.look(["/run/latest"]) == set()  # nothing new: nothing flips
    own.observe_generation(peer.generation)
    own.write_file("/run/latest", b"own 2")  # the store's own change: it wins at once
    assert "/run/latest" not in wins and not wins
    assert wins.look(["/run/latest"]) == set()
    # concurrent changes: equal generations, the larger store UUID wins
    own.observe_generation(peer.generation)
    peer.observe_generation(own.generation)
    g = max(own.generation, peer.generation)
    own.observe_generation(g)
    peer.observe_generation(g)
    own.write_file("/run/tie", b"own")
    peer.write_file("/run/tie", b"peer")
    peer_step()
    peer_wins = peer.config.store_uuid > own.config.store_uuid
    assert ("/run/tie" in wins.look(["/run/tie"])) == peer_wins


def test_a_later_file_over_the_stores_directory_and_a_rename_above_it(node_and_peer):
    own, peer, peer_step, wins = node_and_peer
    own.mkdir(ROOT_INO, b"ckpt")
    own.write_file("/ckpt/a", b"a")
    peer.observe_generation(own.generation)
    peer.write_file("/ckpt", b"a file, later")
    peer_step()
    assert wins.look(["/ckpt"]) == {"/ckpt"}  # a file that wins hides the store's directory
    own.rename(ROOT_INO, b"ckpt", ROOT_INO, b"ckpt-old")  # changed at or above a path: the store's now
    assert not wins
    assert wins.look(["/ckpt"]) == set()  # the store has nothing at /ckpt any more
