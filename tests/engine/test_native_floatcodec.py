"""The fdelta codecs (native/floatcodec.c; 4 rANS states, codec 4, and 32, codec 5) against a
Python reference decoder written from docs/format.md, section 3.2.1: random and edge inputs
decode to the same bytes in both, in the plain C steps and in the vector ones (AVX2, where
the CPU has it), and damaged payloads are refused with ValueError, never read out of bounds
(make sanitize runs this file under ASan/UBSan)."""
from __future__ import annotations

import platform
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cowfs import _native

FORMATS = {"bf16": (2, 7, 8), "f16": (2, 10, 5), "f32": (4, 23, 8)}
PROB_BITS, RANS_L, EBUCKETS = 12, 1 << 15, 16
# (lanes, vector steps allowed): codecs 4 and 5 in plain C and as this CPU runs them
CODERS = [(4, False), (4, True), (32, False), (32, True)]
CODER_IDS = ["4 lanes plain", "4 lanes vector", "32 lanes plain", "32 lanes vector"]


@pytest.fixture(params=CODERS, ids=CODER_IDS)
def coder(request: pytest.FixtureRequest) -> tuple[int, bool]:
    return request.param


def reference_decode(payload: bytes, base: bytes, lanes: int = 4) -> bytes:
    """format.md 3.2.1, step by step, one element at a time."""
    elem, mant, ebits, elo, bshift = payload[:5]
    n, word_bytes, bit_bytes, used = struct.unpack_from("<IIIH", payload, 5)
    nsym, width = 8 * elem + 1, 8 * elem
    pos = 19
    tables: dict[int, list[int]] = {}  # context -> frequency of each symbol
    for _ in range(used):
        ctx, k = struct.unpack_from("<HB", payload, pos)
        pos += 3
        freq = [0] * nsym
        for _ in range(k):
            sym, f = struct.unpack_from("<BH", payload, pos)
            freq[sym] = f + 1
            pos += 3
        assert sum(freq) == 1 << PROB_BITS
        tables[ctx] = freq
    states = list(struct.unpack_from(f"<{lanes}I", payload, pos))
    pos += 4 * lanes
    words = payload[pos:pos + word_bytes]
    bits = int.from_bytes(payload[pos + word_bytes:pos + word_bytes + bit_bytes], "little")
    wpos = bpos = 0
    out = bytearray()
    for i in range(n):
        y = int.from_bytes(base[i * elem:(i + 1) * elem], "little")
        bucket = min(max(((y >> mant) & ((1 << ebits) - 1)) - elo, 0), EBUCKETS - 1)
        freq = tables[bucket >> bshift]
        x = states[i % lanes]
        slot = x & ((1 << PROB_BITS) - 1)
        cum = 0
        for s, f in enumerate(freq):
            if cum <= slot < cum + f:
                break
            cum += f
        x = f * (x >> PROB_BITS) + slot - cum
        if x < RANS_L:
            x = x << 16 | int.from_bytes(words[wpos:wpos + 2], "little")
            wpos += 2
        states[i % lanes] = x
        z = 0
        if s:
            low = (bits >> bpos) & ((1 << (s - 1)) - 1)
            bpos += s - 1
            z = 1 << (s - 1) | low
        d = (z >> 1) ^ -(z & 1)
        out += ((y + d) % (1 << width)).to_bytes(elem, "little")
    assert states == [RANS_L] * lanes and wpos == word_bytes
    return bytes(out)


def encode(raw: bytes, base: bytes, fmt: str, limit: int = 1 << 30, coder: tuple[int, bool] = (4, True)) -> bytes | None:
    return _native.fdelta_encode(raw, base, *FORMATS[fmt], limit, coder[0])


def decode(payload: bytes, base: bytes, coder: tuple[int, bool] = (4, True)) -> bytes:
    out = bytearray(len(base))
    _native.fdelta_decode(payload, base, out, *coder)
    return bytes(out)


def outcome(payload: bytes, base: bytes, coder: tuple[int, bool]) -> bytes | str:
    """The decoded bytes, or the error's text."""
    try:
        return decode(payload, base, coder)
    except ValueError as e:
        return str(e)


def training_pair(n: int, fmt: str, seed: int, step: float = 1e-4) -> tuple[bytes, bytes]:
    """(older, newer) images of a weight that moved by one optimizer step."""
    rng = np.random.default_rng(seed)
    newer = rng.normal(0, 0.02, n).astype(np.float32)
    older = newer + rng.normal(0, step, n).astype(np.float32)
    if fmt == "f32":
        return older.tobytes(), newer.tobytes()
    if fmt == "f16":
        return older.astype(np.float16).tobytes(), newer.astype(np.float16).tobytes()
    return ((older.view(np.uint32) >> 16).astype(np.uint16).tobytes(),
            (newer.view(np.uint32) >> 16).astype(np.uint16).tobytes())


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("n", [3001, 2048 + 37, 4096 + 32])  # not a multiple of the lanes; a block and a part
def test_a_training_step_round_trips_and_matches_the_reference(fmt: str, n: int, coder: tuple[int, bool]) -> None:
    raw, base = training_pair(n, fmt, 1)
    payload = encode(raw, base, fmt, coder=coder)
    assert payload is not None and len(payload) < len(raw) * 0.8  # the low mantissa of f32 steps is noise
    assert decode(payload, base, coder) == raw
    assert reference_decode(payload, base, coder[0]) == raw


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("n", [0, 1, 2, 3, 4, 5, 7, 8, 9, 31, 32, 33, 63, 64, 65])
def test_tiny_pieces(fmt: str, n: int, coder: tuple[int, bool]) -> None:
    raw, base = training_pair(n, fmt, n)
    payload = encode(raw, base, fmt, coder=coder)
    assert payload is not None and decode(payload, base, coder) == raw == reference_decode(payload, base, coder[0])


def test_the_two_codecs_differ_only_in_their_states() -> None:
    """Codec 5's payload is codec 4's with 32 states: the same header and table, 112 more
    bytes of states, and words in another order."""
    raw, base = training_pair(5000, "bf16", 2)
    four, many = encode(raw, base, "bf16", coder=(4, True)), encode(raw, base, "bf16", coder=(32, True))
    assert four is not None and many is not None
    used, pos = struct.unpack_from("<H", four, 17)[0], 19
    for _ in range(used):
        pos += 3 + 3 * four[pos + 2]
    assert many[:9] + many[13:pos] == four[:9] + four[13:pos]  # all but the count of words
    words4, words32 = (struct.unpack_from("<I", p, 9)[0] for p in (four, many))
    assert len(many) - len(four) == 112 + words32 - words4 and abs(words32 - words4) <= 2 * 32
    with pytest.raises(ValueError, match="fdelta payload"):
        decode(four, base, (32, True))  # read with the other number of states: refused
    with pytest.raises(ValueError, match="fdelta payload"):
        decode(many, base, (4, True))


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_edges_identical_random_extremes_and_specials(fmt: str, coder: tuple[int, bool]) -> None:
    elem = FORMATS[fmt][0]
    rng = np.random.default_rng(7)
    noise = rng.integers(0, 256, 4000 * elem, dtype=np.uint8).tobytes()
    other = rng.integers(0, 256, 4000 * elem, dtype=np.uint8).tobytes()
    ones = b"\xff" * (4000 * elem)
    zeros = bytes(4000 * elem)
    specials = (np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, 3e38, -3e38] * 500, np.float32))
    if elem == 2:
        specials = (specials.view(np.uint32) >> 16).astype(np.uint16)
    sp = specials.tobytes()
    for raw, base in ((noise, noise), (noise, other), (ones, zeros), (zeros, ones), (sp, sp[::-1]), (sp, zeros)):
        payload = encode(raw, base, fmt, coder=coder)
        assert payload is not None and decode(payload, base, coder) == raw
        assert reference_decode(payload, base, coder[0]) == raw


@settings(max_examples=90, deadline=None)
@given(st.sampled_from(sorted(FORMATS)), st.binary(max_size=600), st.integers(0, 2**32 - 1), st.sampled_from(CODERS))
def test_any_bytes_round_trip(fmt: str, data: bytes, seed: int, coder: tuple[int, bool]) -> None:
    elem = FORMATS[fmt][0]
    raw = data[:len(data) - len(data) % elem]
    base = np.random.default_rng(seed).integers(0, 256, len(raw), dtype=np.uint8).tobytes()
    if seed % 3 == 0:
        base = raw  # nothing changed
    payload = encode(raw, base, fmt, coder=coder)
    assert payload is not None
    assert decode(payload, base, coder) == raw == reference_decode(payload, base, coder[0])


def test_the_limit_gives_none_and_bad_arguments_are_refused() -> None:
    raw, base = training_pair(1000, "bf16", 3)
    size = len(encode(raw, base, "bf16") or b"")
    assert encode(raw, base, "bf16", size) is not None and encode(raw, base, "bf16", size - 1) is None
    with pytest.raises(ValueError, match="element size"):
        _native.fdelta_encode(raw, base, 3, 7, 8, 1 << 20)
    with pytest.raises(ValueError, match="exponent"):
        _native.fdelta_encode(raw, base, 2, 12, 8, 1 << 20)
    with pytest.raises(ValueError, match="bytes against"):
        _native.fdelta_encode(raw, base[:-2], 2, 7, 8, 1 << 20)
    payload = encode(raw, base, "bf16")
    assert payload is not None
    with pytest.raises(ValueError, match="lengths differ"):
        _native.fdelta_decode(payload, base, bytearray(len(base) - 2))
    with pytest.raises(ValueError, match="element count"):
        _native.fdelta_decode(payload, base[:-2], bytearray(len(base) - 2))
    with pytest.raises(ValueError, match="lanes"):
        _native.fdelta_encode(raw, base, 2, 7, 8, 1 << 20, 8)
    with pytest.raises(ValueError, match="lanes"):
        _native.fdelta_decode(payload, base, bytearray(len(base)), 16)


def missing_context_element(payload: bytes) -> bytes:
    """An element whose exponent bucket falls in a context the payload has no table for."""
    elem, mant, ebits, elo, bshift = payload[:5]
    used = struct.unpack_from("<H", payload, 17)[0]
    pos, contexts = 19, set()
    for _ in range(used):
        ctx, k = struct.unpack_from("<HB", payload, pos)
        contexts.add(ctx)
        pos += 3 + 3 * k
    for b in range(EBUCKETS):
        if b >> bshift not in contexts and elo + b < 1 << ebits:
            return ((elo + b) << mant).to_bytes(elem, "little")
    raise AssertionError(f"every context has a table: {sorted(contexts)} (bshift {bshift})")


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("at", [0, 2047, 2048, 5999])  # the first block, its end, the next block, the last element
def test_a_base_element_whose_context_has_no_table_is_refused(fmt: str, at: int, coder: tuple[int, bool]) -> None:
    """A base element in an exponent bucket the tables lack (a base other than the encoder's):
    the reference decoder finds no table for it, and the native one refuses the payload."""
    rng = np.random.default_rng(4)  # small weights that stayed, large ones that moved a lot:
    n = 6000                         # two exponent clusters, each with its own table, none between
    newer = np.concatenate([np.full(n // 2, 0.001, np.float32), np.full(n // 2, 1.5, np.float32)])
    newer *= 1 + rng.normal(0, 0.01, n).astype(np.float32)
    older = newer.copy()
    older[n // 2:] += rng.normal(0, 0.5, n // 2).astype(np.float32)
    if fmt == "f32":
        raw, base = older.tobytes(), newer.tobytes()
    elif fmt == "f16":
        raw, base = older.astype(np.float16).tobytes(), newer.astype(np.float16).tobytes()
    else:
        raw, base = ((older.view(np.uint32) >> 16).astype(np.uint16).tobytes(),
                     (newer.view(np.uint32) >> 16).astype(np.uint16).tobytes())
    payload = encode(raw, base, fmt, coder=coder)
    assert payload is not None
    elem = FORMATS[fmt][0]
    bad = base[:at * elem] + missing_context_element(payload) + base[(at + 1) * elem:]
    with pytest.raises(KeyError):
        reference_decode(payload, bad, coder[0])
    with pytest.raises(ValueError, match="context the table does not have"):
        decode(payload, bad, coder)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_damaged_payloads_are_refused_or_decode_to_other_bytes(fmt: str, coder: tuple[int, bool]) -> None:
    """Every truncation and many byte flips: a ValueError, or (a flip the format cannot
    see, in the raw bits) other bytes, which the chunk id's check then catches. The plain
    and vector steps give the same outcome, error text included."""
    raw, base = training_pair(2000, fmt, 11)
    payload = encode(raw, base, fmt, coder=coder)
    assert payload is not None
    for cut in list(range(0, 200)) + list(range(200, len(payload), 97)):
        with pytest.raises(ValueError, match="fdelta payload"):
            decode(payload[:cut], base, coder)
    with pytest.raises(ValueError, match="fdelta payload"):
        decode(payload + b"\0", base, coder)
    rng = np.random.default_rng(5)
    bits_at = len(payload) - struct.unpack_from("<I", payload, 13)[0]  # where the raw bits start
    refused = coded = 0
    for at in rng.integers(0, len(payload), 400):
        bad = bytearray(payload)
        bad[at] ^= 1 << int(rng.integers(0, 8))
        coded += at < bits_at
        got = outcome(bytes(bad), base, coder)
        assert got == outcome(bytes(bad), base, (coder[0], not coder[1]))
        if isinstance(got, str):
            refused += 1
            continue
        assert len(got) == len(raw)
    assert refused >= coded // 2  # a flip in the header, table or rANS words is mostly seen


def test_the_vector_steps_run_exactly_where_the_cpu_has_avx2() -> None:
    """So that the "vector" cases above test the AVX2 steps on such a CPU, not the plain
    ones again; and a CPU without AVX2 (or not x86) is never sent to them."""
    flags: list[str] = []
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                flags = line.split(":", 1)[1].split()
                break
    x86 = platform.machine() in ("x86_64", "AMD64")
    assert _native.fdelta_simd() is (x86 and "avx2" in flags)
