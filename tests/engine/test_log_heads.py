"""Several head segments: appends running at once write different segment files; sync,
gc, close and reopen see every head; a head that finds no room hands its append to the
first head. Every store is fsck'ed clean at teardown (conftest)."""
from __future__ import annotations

import os
import threading

import pytest

from cowfs import _native
from cowfs.errors import NoSpace
from cowfs.store import ROOT_INO, Store
from cowfs.store.data.chunking import CDC_PARAMS
from cowfs.store.log.heads import Heads
from cowfs.store.log.records import record_span
from tests.support.consumerutil import wait_for

WAIT = 60.0  # seconds a step may take before the test fails (a busy CI machine)


def _append(log, data: bytes):
    """Stage and append `data`'s chunks; returns (locations, ids, sizes)."""
    lengths, ids, _ = _native.cdc_hash_batch(CDC_PARAMS, [data], True)
    sizes = memoryview(lengths).cast("I").tolist()
    need = sum(record_span(n) for n in sizes)
    with log.staging(need) as staged:
        _native.stage_records([data], lengths, ids, b"\1" * len(sizes), 1, staged)
        return log.append_staged(staged, sizes), ids, sizes


def test_a_lone_writer_keeps_one_head(store) -> None:
    for _ in range(3):
        _append(store.log, os.urandom(300_000))
    assert len(store.log.head_positions()) == 1


def test_an_append_while_the_head_is_taken_goes_to_a_second_segment(store) -> None:
    log = store.log
    first, _, _ = _append(log, os.urandom(200_000))
    with log._heads.take() as held:  # as if another append were writing into it
        assert held.seg_id == first[0].seg_id
        second, ids, sizes = _append(log, os.urandom(200_000))
    assert {loc.seg_id for loc in second} != {first[0].seg_id}
    heads = log.head_positions()
    assert set(heads) == {first[0].seg_id, second[0].seg_id}
    last = second[-1]
    assert heads[last.seg_id] == last.offset + record_span(last.stored_len)
    ends = log.sync()  # both heads' records made durable, each to its end
    assert ends[last.seg_id] == heads[last.seg_id]
    for i, loc in enumerate(second):
        assert len(log.read_chunk(loc, ids[32 * i:32 * i + 32])) == sizes[i]


def test_heads_are_capped_and_the_next_waits_its_turn() -> None:
    heads = Heads(2)
    got = threading.Event()
    with heads.take() as a, heads.take() as b:
        assert a is not b

        def third() -> None:
            with heads.take() as c:
                assert c in (a, b)
                got.set()

        t = threading.Thread(target=third, daemon=True)
        t.start()
        assert not got.wait(0.05)  # both heads busy: it waits
    t.join(WAIT)
    assert got.is_set() and len(list(heads)) == 2
    with pytest.raises(ValueError, match="at least one head"):
        Heads(0)


def test_two_sessions_at_once_commit_from_two_heads_and_survive_gc_and_reopen(store_path) -> None:
    """Two writers in threads whose appends overlap (each waits inside the other's append):
    both files commit, gc keeps every record of both heads, and after a reopen (recovery
    cuts each segment at its committed end) both read back whole."""
    datas = {b"a": os.urandom(3 << 20), b"b": os.urandom(3 << 20)}
    with Store.open(store_path) as s:
        inos = {name: s.create(ROOT_INO, name).ino for name in datas}
        real = s.log._append_staged
        inside = threading.Barrier(2, timeout=WAIT)
        met = []

        def overlapping(head, *args):  # the first append of each writer waits for the other's
            if len(met) < 2:
                met.append(head)
                inside.wait()
            return real(head, *args)

        s.log._append_staged = overlapping
        errors: list[BaseException] = []

        def write(name: bytes) -> None:
            try:
                with s.open_session(inos[name]) as w:
                    w.write(0, datas[name])
                    w.commit()
            except BaseException as e:  # reported below
                errors.append(e)

        ts = [threading.Thread(target=write, args=(n,)) for n in datas]
        for t in ts:
            t.start()
        for t in ts:
            t.join(60)
        assert not errors and not any(t.is_alive() for t in ts)
        assert met[0] is not met[1]  # two heads took appends at once
        assert len(s.log.head_positions()) == 2
        s.gc()
        for name, data in datas.items():
            with s.open_reader(inos[name]) as r:
                assert bytes(r.read(0, len(data))) == data
    with Store.open(store_path) as s:
        for name, data in datas.items():
            with s.open_reader(inos[name]) as r:
                assert bytes(r.read(0, len(data))) == data


def test_a_new_head_without_room_hands_its_append_to_the_first(store) -> None:
    log = store.log
    first, _, _ = _append(log, os.urandom(100_000))
    real_cls = log._seg_cls
    tried = threading.Event()

    def full(path, size):
        tried.set()
        raise NoSpace(f"preallocate {path}: no space left on device")

    log._seg_cls = type("Full", (real_cls,), {"create": staticmethod(full)})
    result: list = []
    with log._heads.take():  # the first head busy: the append opens a second, which finds no room
        t = threading.Thread(target=lambda: result.append(_append(log, os.urandom(100_000))), daemon=True)
        t.start()
        assert tried.wait(WAIT)
        # the new head is given up before the append waits for the first
        wait_for("the new head given up", lambda: len(list(log._heads)) == 1)
    t.join(WAIT)
    log._seg_cls = real_cls
    locs = result[0][0]
    assert {loc.seg_id for loc in locs} == {first[0].seg_id}  # appended behind the first head
    assert len(log.head_positions()) == 1
