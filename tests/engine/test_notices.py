"""Notices carrying their objects (remote/notices.py): a line signed under the producer's key
carries the catalog object and pack indexes; a line that is too large goes plain; a line
whose signature does not check, or a consumer without the key, keeps only the key."""
from __future__ import annotations

import json
import os

import pytest

from cowfs.remote.notices import INLINE_MAX, Inline, decode_notice, encode_notice

KEY = os.urandom(32)
STORE = "0123456789abcdef0123456789abcdef"


def inline(n: int = 1000) -> Inline:
    return Inline(os.urandom(n), {"aa" * 32: os.urandom(77), "bb" * 32: b""})


def test_a_signed_line_carries_the_objects_byte_for_byte():
    carried = inline()
    line = encode_notice(STORE, 7, "p/stores/x/catalog/7.from-6.delta.zst", carried, KEY)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    notice = decode_notice(line, KEY)
    assert (notice.store, notice.generation, notice.key) == (STORE, 7, "p/stores/x/catalog/7.from-6.delta.zst")
    assert notice.inline == carried


def test_a_plain_line_and_one_past_the_bound_carry_nothing():
    assert decode_notice(encode_notice(STORE, 3, "k", None, KEY), KEY).inline is None
    big = Inline(os.urandom(INLINE_MAX), {"cc" * 32: b"x"})
    line = encode_notice(STORE, 3, "k", big, KEY)
    assert b"catalog" not in line and decode_notice(line, KEY).inline is None
    at_bound = Inline(os.urandom(INLINE_MAX))
    assert decode_notice(encode_notice(STORE, 3, "k", at_bound, KEY), KEY).inline == at_bound


@pytest.mark.parametrize("change", ["catalog", "index", "generation", "key", "mac", "no mac"])
def test_a_line_changed_on_the_way_keeps_only_what_it_names(change):
    msg = json.loads(encode_notice(STORE, 9, "k9", inline(), KEY))
    if change == "catalog":
        msg["catalog"] = msg["catalog"][:-8] + "AAAAAAA="
    elif change == "index":
        msg["indexes"]["aa" * 32] = msg["indexes"]["bb" * 32]
    elif change == "generation":
        msg["generation"] = 10
    elif change == "key":
        msg["key"] = "k10"
    elif change == "mac":
        msg["mac"] = "0" * 64
    else:
        del msg["mac"]
    notice = decode_notice(json.dumps(msg).encode() + b"\n", KEY)
    assert notice.inline is None  # read from the bucket instead
    assert notice.generation == msg["generation"] and notice.key == msg["key"]


def test_without_the_producers_key_nothing_carried_is_trusted():
    line = encode_notice(STORE, 4, "k", inline(), KEY)
    assert decode_notice(line, None).inline is None
    assert decode_notice(line, os.urandom(32)).inline is None


def test_a_line_that_is_no_notice_is_refused():
    with pytest.raises((ValueError, KeyError)):
        decode_notice(b'{"store": "x"}\n', KEY)
    with pytest.raises(ValueError):
        decode_notice(b"not json\n", KEY)


def test_a_batch_takes_each_stores_newest_notice_with_what_that_one_carried():
    from cowfs.fs.union_follow import join_batch

    wanted: dict = {}
    carried: dict = {}
    a5, b3 = inline(10), inline(20)
    for notice in [("a", 5, "k5", a5), ("b", 3, "j3", b3), ("a", 4, "k4", inline(30)), ("b", 4, "j4", None)]:
        join_batch(wanted, carried, notice)
    assert wanted == {"a": (5, "k5"), "b": (4, "j4")}
    assert carried == {"a": a5}  # b's newest notice carried nothing: its older one's objects are not used
    join_batch(wanted, carried, ("a", 6, "k6", None))
    assert wanted["a"] == (6, "k6") and carried == {}


def test_a_store_is_looked_at_once_quiet_and_said_once_per_quiet_spell(caplog):
    from cowfs.fs.union_follow import QUIET_SECONDS, QuietStores
    quiet = QuietStores()
    quiet.listening("s", 100.0)
    said = lambda: sum("sends no notices" in r.getMessage() for r in caplog.records)  # noqa: E731
    with caplog.at_level("WARNING", logger="cowfs.replica"):
        assert not quiet.should_look("s", False, 100.0 + QUIET_SECONDS / 2)  # not quiet long enough yet
        assert quiet.should_look("s", False, 100.0 + QUIET_SECONDS)
        assert quiet.should_look("s", False, 100.0 + 2 * QUIET_SECONDS)
        assert said() == 1
        assert not quiet.should_look("s", True, 200.0)  # connected: the quiet time starts again
        assert not quiet.should_look("s", False, 200.0 + QUIET_SECONDS / 2)
        assert quiet.should_look("s", False, 200.0 + QUIET_SECONDS)
        assert said() == 2  # a new quiet spell is said again
        assert quiet.should_look("t", False, 300.0) is False  # a store never seen counts from its first look
        quiet.forget("s")
        assert not quiet.should_look("s", False, 300.0)
