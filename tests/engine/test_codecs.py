"""Chunk encodings (cowfs/store/log/codecs.py): every encoding decodes to the exact raw bytes, a
piece that does not shrink stays raw, deltas need their base, and damage is CorruptData."""
from __future__ import annotations

import math
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cowfs import _native
from cowfs.errors import CorruptData
from cowfs.store.log.codecs import (
    CODEC_FDELTA,
    CODEC_FDELTA32,
    CODEC_GROUPED,
    CODEC_RAW,
    CODEC_SUB,
    CODEC_XOR,
    BLOSC_ONLY,
    DELTA_MAX_SHARE,
    FDELTA_ONLY,
    FDELTA_SURE,
    ID_SIZE,
    base_of,
    decode,
    encode_delta,
    encode_whole,
    sub_bytes,
    xor_bytes,
)

NEVER = 1 << 40  # encode_delta's `whole_len`: any delta is small enough


def weights(n: int, seed: int, dtype: type = np.float32) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 0.02, n).astype(dtype)


def bf16(a: np.ndarray) -> bytes:
    return (a.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes()


def no_base(_id: bytes) -> bytes:
    raise AssertionError("a whole encoding asked for a base")


def test_float_pieces_are_grouped_and_shrink() -> None:
    raw = bf16(weights(1 << 18, 1))
    enc = encode_whole(raw, 2)
    assert enc.codec == CODEC_GROUPED and enc.stored_len < 0.85 * len(raw)
    assert bytes(decode(enc.codec, enc.payload, len(raw), no_base)) == raw


def test_random_bytes_stay_raw() -> None:
    raw = os.urandom(1 << 16)
    enc = encode_whole(raw, 4)
    assert enc.codec == CODEC_RAW and enc.payload == raw
    assert bytes(decode(CODEC_RAW, raw, len(raw), no_base)) == raw


def test_delta_against_the_previous_version_is_smaller_and_exact() -> None:
    old = weights(1 << 18, 2)
    new = old + np.random.default_rng(3).normal(0, 1e-5, old.shape).astype(np.float32)
    base, raw = bf16(old), bf16(new)
    base_id = b"b" * ID_SIZE
    enc = encode_delta(raw, 2, base_id, base, NEVER)
    assert enc is not None
    assert enc.codec == CODEC_SUB and enc.base == base_id and base_of(enc.codec, enc.payload) == base_id
    assert enc.stored_len < encode_whole(raw, 2).stored_len
    asked: list[bytes] = []
    out = decode(enc.codec, enc.payload, len(raw), lambda i: asked.append(i) or base)
    assert bytes(out) == raw and asked == [base_id]


def test_a_delta_that_does_not_beat_the_present_record_is_not_made() -> None:
    raw = bf16(weights(1 << 16, 4))
    whole = encode_whole(raw, 2)
    assert encode_delta(raw, 2, b"x" * ID_SIZE, os.urandom(len(raw)), whole.stored_len) is None


def test_a_delta_must_save_a_tenth_of_the_whole_record() -> None:
    raw = bf16(weights(1 << 16, 4))
    base = bf16(weights(1 << 16, 5))
    size = encode_delta(raw, 2, b"x" * ID_SIZE, base, NEVER).stored_len  # type: ignore[union-attr]
    least = math.floor(size / DELTA_MAX_SHARE)  # the smallest whole record this delta beats by a tenth
    while size > least * DELTA_MAX_SHARE:
        least += 1
    assert least > size * 1.1  # (a tenth of the whole, not of the delta)
    assert encode_delta(raw, 2, b"x" * ID_SIZE, base, least) is not None
    assert encode_delta(raw, 2, b"x" * ID_SIZE, base, least - 1) is None


def test_odd_element_sizes_use_xor() -> None:
    base = os.urandom(3 * 4000)
    raw = bytearray(base)
    raw[7] ^= 1
    enc = encode_delta(bytes(raw), 3, b"x" * ID_SIZE, base, NEVER)
    assert enc is not None and enc.codec == CODEC_XOR
    assert bytes(decode(enc.codec, enc.payload, len(raw), lambda _i: base)) == raw


def test_subtraction_beats_xor_on_small_float_changes() -> None:
    old = weights(1 << 18, 8)
    new = (old + np.random.default_rng(9).normal(0, 1e-6, old.shape)).astype(np.float32)
    sub = encode_whole(sub_bytes(new.tobytes(), old.tobytes(), 4).tobytes(), 4).stored_len
    xor = encode_whole(xor_bytes(new.tobytes(), old.tobytes()).tobytes(), 4).stored_len
    assert sub < xor


def test_a_delta_chain_decodes_through_every_base() -> None:
    versions = [weights(1 << 14, 5)]
    for k in range(3):
        versions.append(versions[-1] + np.float32(1e-4) * (k + 1))
    raws = [v.tobytes() for v in versions]
    ids = [bytes([k]) * ID_SIZE for k in range(len(raws))]
    stored = {ids[-1]: encode_whole(raws[-1], 4)}  # the newest whole, older ones against the next newer
    for k in range(len(raws) - 1):
        enc = encode_delta(raws[k], 4, ids[k + 1], raws[k + 1], NEVER)
        assert enc is not None
        stored[ids[k]] = enc

    def raw_of(cid: bytes) -> bytes:
        e = stored[cid]
        return bytes(decode(e.codec, e.payload, len(raws[0]), raw_of))

    assert [raw_of(i) for i in ids] == raws


def test_damage_is_corrupt_data() -> None:
    raw = bf16(weights(1 << 16, 6))
    enc = encode_whole(raw, 2)
    with pytest.raises(CorruptData):
        decode(enc.codec, enc.payload[:20], len(raw), no_base)
    with pytest.raises(CorruptData):
        decode(enc.codec, enc.payload, len(raw) + 2, no_base)
    with pytest.raises(CorruptData):
        decode(CODEC_RAW, raw[:-1], len(raw), no_base)
    with pytest.raises(CorruptData):
        decode(9, enc.payload, len(raw), no_base)
    with pytest.raises(CorruptData, match="base"):  # a base of another length
        decode(CODEC_XOR, b"d" * ID_SIZE + enc.payload, len(raw), lambda _i: raw[:-2])
    with pytest.raises(CorruptData):
        decode(CODEC_XOR, b"short", len(raw), no_base)
    with pytest.raises(CorruptData):
        decode(CODEC_SUB, b"short", len(raw), no_base)


@settings(max_examples=60, deadline=None)
@given(st.binary(min_size=0, max_size=3000), st.binary(min_size=0, max_size=3000), st.sampled_from([1, 2, 4, 8, 3]))
def test_every_encoding_round_trips(a: bytes, b: bytes, elem: int) -> None:
    n = min(len(a), len(b))
    raw, base = a[:n], b[:n]
    assert bytes(xor_bytes(xor_bytes(raw, base), base)) == raw
    delta = encode_delta(raw, elem, b"i" * ID_SIZE, base, NEVER)
    assert delta is not None and delta.codec == (CODEC_SUB if n % elem == 0 and elem != 3 else CODEC_XOR)
    for enc in (encode_whole(raw, elem), delta):
        assert bytes(decode(enc.codec, enc.payload, n, lambda _i: base)) == raw


def test_blosc2_is_loaded_at_first_use_with_the_gil_released():
    import blosc2

    from cowfs.store.log import codecs

    codecs.encode_whole(bytes(range(256)) * 64, 4)
    assert blosc2.set_releasegil(True) is True  # the previous setting: the engine's first use set it


def _waits_of_decoding(monkeypatch, threads: int) -> int:  # type: ignore[no-untyped-def]
    """This thread's voluntary context switches while it decodes 20 grouped pieces of 1 MiB."""
    import resource

    from cowfs.store.log import codecs

    monkeypatch.setattr(codecs, "DECODE_THREADS", threads)
    raw = weights(1 << 18, 9).tobytes()
    enc = encode_whole(raw, 4)
    assert enc.codec == CODEC_GROUPED
    before = resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw
    for _ in range(20):
        assert bytes(decode(enc.codec, enc.payload, len(raw), lambda _i: b"")) == raw
    return resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw - before


def test_decoding_starts_no_blosc2_threads(monkeypatch) -> None:
    """Blosc2 would start and join a thread per core in every call (2.8x the CPU with 16)."""
    from cowfs.store.log import codecs

    assert _waits_of_decoding(monkeypatch, codecs.DECODE_THREADS) < 5
    assert _waits_of_decoding(monkeypatch, 2) >= 20  # with threads of its own, each call waits for them


def test_a_float_piece_takes_the_float_delta_and_decodes_exactly() -> None:
    old = weights(1 << 18, 4)
    new = old + np.random.default_rng(5).normal(0, 1e-4, old.shape).astype(np.float32)
    base, raw = bf16(old), bf16(new)
    base_id = b"f" * ID_SIZE
    enc = encode_delta(raw, 2, base_id, base, NEVER, "BF16")
    sub = encode_delta(raw, 2, base_id, base, NEVER)  # no dtype: the Blosc2 delta as before
    assert enc is not None and sub is not None and sub.codec == CODEC_SUB
    assert enc.codec == CODEC_FDELTA32 and base_of(enc.codec, enc.payload) == base_id
    assert enc.stored_len < sub.stored_len and enc.stored_len <= FDELTA_SURE * len(raw)
    assert bytes(decode(enc.codec, enc.payload, len(raw), lambda i: base)) == raw
    # f32 and f16 too; a dtype whose element size does not match falls back to Blosc2's
    for dtype, arr in (("F32", np.float32), ("F16", np.float16)):
        b32, r32 = old.astype(arr).tobytes(), new.astype(arr).tobytes()
        e = encode_delta(r32, arr().itemsize, base_id, b32, NEVER, dtype)
        assert e is not None and bytes(decode(e.codec, e.payload, len(r32), lambda i: b32)) == r32
    assert encode_delta(raw, 2, base_id, base, NEVER, "F32").codec == CODEC_SUB  # type: ignore[union-attr]
    # a store upgraded from format 6 holds codec 4 records (four states): still decoded
    four = base_id + _native.fdelta_encode(raw, base, 2, 7, 8, NEVER, 4)
    assert bytes(decode(CODEC_FDELTA, four, len(raw), lambda i: base)) == raw
    with pytest.raises(CorruptData, match="fdelta payload"):  # a codec 5 payload read as codec 4
        decode(CODEC_FDELTA, enc.payload, len(raw), lambda i: base)


def test_the_smaller_delta_wins_and_none_when_neither_saves_a_tenth() -> None:
    """An AdamW second moment one checkpoint older: the same decay for every element, plus a
    little noise. Blosc2's LZ finds the repeats a per-element model prices one by one."""
    rng = np.random.default_rng(6)
    v = rng.exponential(1e-6, 1 << 16).astype(np.float32)
    base, raw = bf16(v), bf16(v / 0.98 + rng.exponential(1e-8, v.size))
    enc = encode_delta(raw, 2, b"r" * ID_SIZE, base, NEVER, "BF16")
    assert enc is not None and enc.codec == CODEC_SUB
    assert enc.stored_len - ID_SIZE < len(_native.fdelta_encode(raw, base, 2, 7, 8, NEVER))
    noise = np.random.default_rng(8).integers(0, 1 << 16, 1 << 16, dtype=np.uint16).tobytes()
    assert encode_delta(noise, 2, b"r" * ID_SIZE, base, len(noise), "BF16") is None


def test_a_damaged_float_delta_is_corrupt_data() -> None:
    old = weights(1 << 14, 7)
    base, raw = bf16(old), bf16(old * 1.001)
    enc = encode_delta(raw, 2, b"d" * ID_SIZE, base, NEVER, "BF16")
    assert enc is not None and enc.codec == CODEC_FDELTA32
    bad = bytearray(enc.payload)
    bad[ID_SIZE + 6] ^= 0xFF  # the element count
    with pytest.raises(CorruptData, match="fdelta payload"):
        decode(CODEC_FDELTA32, bytes(bad), len(raw), lambda i: base)
    with pytest.raises(CorruptData, match="fdelta payload"):
        decode(CODEC_FDELTA32, bytes(enc.payload)[:-9], len(raw), lambda i: base)


def test_the_orders_change_what_is_tried_never_what_decodes() -> None:
    rng = np.random.default_rng(9)
    v = rng.exponential(1e-6, 1 << 16).astype(np.float32)
    base, raw = bf16(v), bf16(v / 0.98 + rng.exponential(1e-8, v.size))  # Blosc2's delta is the smaller
    only = encode_delta(raw, 2, b"o" * ID_SIZE, base, NEVER, "BF16", FDELTA_ONLY)
    first = encode_delta(raw, 2, b"o" * ID_SIZE, base, NEVER, "BF16", BLOSC_ONLY)
    assert only is not None and only.codec == CODEC_FDELTA32  # trusted: Blosc2's not tried
    assert first is not None and first.codec == CODEC_SUB and first.stored_len < only.stored_len
    old = weights(1 << 16, 10)
    w_base, w_raw = bf16(old), bf16(old + rng.normal(0, 1e-4, old.shape).astype(np.float32))
    trusted = encode_delta(w_raw, 2, b"o" * ID_SIZE, w_base, NEVER, "BF16", BLOSC_ONLY)
    assert trusted is not None and trusted.codec == CODEC_SUB  # trusted too, though the float delta is smaller
    noisy = rng.integers(0, 1 << 16, 1 << 16, dtype=np.uint16).tobytes()  # Blosc2's cannot save a tenth:
    limit = len(noisy)  # the float delta is tried (it cannot either)
    assert encode_delta(noisy, 2, b"o" * ID_SIZE, w_base, limit, "BF16", BLOSC_ONLY) is None
    for enc, (r, b) in ((only, (raw, base)), (first, (raw, base)), (trusted, (w_raw, w_base))):
        assert bytes(decode(enc.codec, enc.payload, len(r), lambda i, b=b: b)) == r
