"""_native.blake3_many (native/blake3_batch.c, over the vendored BLAKE3
C library in native/blake3/) against the blake3 package, the chunk ids' reference."""

import array
import random
import threading
from concurrent.futures import ThreadPoolExecutor

import blake3 as blake3_pkg
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cowfs import _native

KiB = 1 << 10


def ref(data) -> bytes:
    return blake3_pkg.blake3(bytes(data)).digest()


def one(data) -> bytes:
    """The digest of one whole buffer by blake3_many (a single span of all its bytes)."""
    return _native.blake3_many(data, [memoryview(data).nbytes])


def ref_many(data, lengths) -> bytes:
    out, pos = [], 0
    for n in lengths:
        out.append(ref(data[pos:pos + n]))
        pos += n
    return b"".join(out)


def pattern(n: int) -> bytes:
    """Upstream's test-vector input: 0, 1, ..., 250, 0, 1, ... (test_vectors/test_vectors.json)."""
    return bytes(i % 251 for i in range(n))


# BLAKE3 1.8.6 test_vectors/test_vectors.json: "hash" of pattern(n), its first 32 bytes
OFFICIAL = {
    0: "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262",
    1: "2d3adedff11b61f14c886e35afa036736dcd87a74d27b5c1510225d0f592e213",
    63: "e9bc37a594daad83be9470df7f7b3798297c3d834ce80ba85d6e207627b7db7b",
    64: "4eed7141ea4a5cd4b788606bd23f46e212af9cacebacdc7d1f4c6dc7f2511b98",
    65: "de1e5fa0be70df6d2be8fffd0e99ceaa8eb6e8c93a63f2d8d1c30ecb6b263dee",
    1023: "10108970eeda3eb932baac1428c7a2163b0e924c9a9e25b35bba72b28f70bd11",
    1024: "42214739f095a406f3fc83deb889744ac00df831c10daa55189b5d121c855af7",
    1025: "d00278ae47eb27b34faecf67b4fe263f82d5412916c1ffd97c8cb7fb814b8444",
    2048: "e776b6028c7cd22a4d0ba182a8bf62205d2ef576467e838ed6f2529b85fba24a",
    2049: "5f4d72f40d7a5f82b15ca2b2e44b1de3c2ef86c426c95c1af0b6879522563030",
    3072: "b98cb0ff3623be03326b373de6b9095218513e64f1ee2edd2525c7ad1e5cffd2",
    3073: "7124b49501012f81cc7f11ca069ec9226cecb8a2c850cfe644e327d22d3e1cd3",
    4096: "015094013f57a5277b59d8475c0501042c0b642e531b0a1c8f58d2163229e969",
    4097: "9b4052b38f1c5fc8b1f9ff7ac7b27cd242487b3d890d15c96a1c25b8aa0fb995",
    5120: "9cadc15fed8b5d854562b26a9536d9707cadeda9b143978f319ab34230535833",
    5121: "628bd2cb2004694adaab7bbd778a25df25c47b9d4155a55f8fbd79f2fe154cff",
    6144: "3e2e5b74e048f3add6d21faab3f83aa44d3b2278afb83b80b3c35164ebeca205",
    6145: "f1323a8631446cc50536a9f705ee5cb619424d46887f3c376c695b70e0f0507f",
    7168: "61da957ec2499a95d6b8023e2b0e604ec7f6b50e80a9678b89d2628e99ada77a",
    7169: "a003fc7a51754a9b3c7fae0367ab3d782dccf28855a03d435f8cfe74605e7817",
    8192: "aae792484c8efe4f19e2ca7d371d8c467ffb10748d8a5a1ae579948f718a2a63",
    8193: "bab6c09cb8ce8cf459261398d2e7aef35700bf488116ceb94a36d0f5f1b7bc3b",
    16384: "f875d6646de28985646f34ee13be9a576fd515f76b5b0a26bb324735041ddde4",
    31744: "62b6960e1a44bcc1eb1a611a8d6235b6b4b78f32e7abc4fb4c6cdcce94895c47",
    102400: "bc3e3d41a1146b069abffad3c0d44860cf664390afce4d9661f7902e7943e085",
}


@pytest.mark.parametrize("n", sorted(OFFICIAL))
def test_official_vectors(n):
    data = pattern(n)
    assert one(data).hex() == OFFICIAL[n]
    assert ref(data).hex() == OFFICIAL[n]  # the reference agrees with upstream
    assert _native.blake3_many(data, [n]).hex() == OFFICIAL[n]


def test_official_vectors_in_one_batch():
    """Every edge length as one span of a single buffer, in one call."""
    lengths = sorted(OFFICIAL)
    data = b"".join(pattern(n) for n in lengths)
    out = _native.blake3_many(data, lengths)
    assert len(out) == 32 * len(lengths)
    assert [out[32 * i:32 * i + 32].hex() for i in range(len(lengths))] == [OFFICIAL[n] for n in lengths]


def _as(kind, data: bytes):
    if kind == "bytes":
        return data
    if kind == "bytearray":
        return bytearray(data)
    if kind == "memoryview":
        return memoryview(data)
    if kind == "slice":  # a contiguous memoryview that starts inside a larger buffer
        return memoryview(b"x" * 7 + data + b"y" * 5)[7:7 + len(data)]
    if kind == "numpy":
        return np.frombuffer(data, dtype=np.uint8)
    raise AssertionError(kind)


def _lengths_as(kind, lengths):
    if kind == "list":
        return list(lengths)
    if kind == "tuple":
        return tuple(lengths)
    if kind == "array":
        return array.array("I", lengths)
    if kind == "numpy":
        return np.asarray(lengths, dtype=np.uint32)
    if kind == "cast":
        return memoryview(array.array("I", lengths).tobytes()).cast("I")
    raise AssertionError(kind)


@settings(max_examples=200, deadline=None)
@given(
    size=st.integers(0, 300 * KiB),
    seed=st.integers(0, 2**32 - 1),
    cuts=st.lists(st.floats(0, 1), max_size=40),
    whole=st.booleans(),
    data_kind=st.sampled_from(["bytes", "bytearray", "memoryview", "slice", "numpy"]),
    lengths_kind=st.sampled_from(["list", "tuple", "array", "numpy", "cast"]),
)
def test_blake3_many_matches_reference(size, seed, cuts, whole, data_kind, lengths_kind):
    data = random.Random(seed).randbytes(size)
    # cut points anywhere in the buffer, repeats allowed (zero-length spans); when not
    # whole, the spans end at the last cut and the rest of the buffer is not hashed
    points = sorted(int(c * size) for c in cuts)
    if whole or not points:
        points.append(size)
    lengths = [b - a for a, b in zip([0] + points, points)]
    out = _native.blake3_many(_as(data_kind, data), _lengths_as(lengths_kind, lengths))
    assert out == ref_many(data, lengths)
    assert one(_as(data_kind, data)) == ref(data)


@settings(max_examples=100, deadline=None)
@given(data=st.binary(max_size=5000), lengths=st.lists(st.integers(0, 300), max_size=30))
def test_blake3_many_small_spans(data, lengths):
    if sum(lengths) > len(data):
        with pytest.raises(ValueError, match="add up to more than the buffer"):
            _native.blake3_many(data, lengths)
    else:
        assert _native.blake3_many(data, lengths) == ref_many(data, lengths)


def test_zero_length_spans_and_no_spans():
    empty = ref(b"")
    assert _native.blake3_many(b"", []) == b""
    assert _native.blake3_many(b"abc", []) == b""
    assert _native.blake3_many(b"", [0, 0]) == empty * 2
    assert _native.blake3_many(b"abc", [0, 3, 0]) == empty + ref(b"abc") + empty
    assert one(b"") == empty
    assert one(bytearray()) == empty


def test_writable_and_readonly_buffers():
    data = bytearray(pattern(10_000))
    assert one(data) == ref(data)
    assert one(memoryview(data)[100:9000]) == ref(data[100:9000])
    assert _native.blake3_many(memoryview(bytes(data)).toreadonly(), [1, 2, 3]) == ref_many(data, [1, 2, 3])
    # a buffer of wider items is hashed as its bytes
    wide = array.array("Q", range(1000))
    assert one(wide) == ref(wide.tobytes())
    assert _native.blake3_many(wide, [8000]) == ref(wide.tobytes())


def test_lengths_as_large_ints_and_index_objects():
    data = pattern(3000)
    assert _native.blake3_many(data, [np.int64(1000), np.uint16(2000)]) == ref_many(data, [1000, 2000])


def _released(ba: bytearray, lens: array.array):
    """True when nothing still exports ba or lens (their buffers were released)."""
    if _native.bytearray_exported(ba):
        return False
    lens.append(0)  # BufferError while exported
    lens.pop()
    return True


@pytest.mark.parametrize(
    "lengths, exc, match",
    [
        ([10, 20, 100], ValueError, r"lengths add up to more than the buffer's 100 bytes \(lengths\[2\] = 100 starts at byte 30\)"),
        ([101], ValueError, "add up to more than the buffer's 100 bytes"),
        ([2**40], ValueError, "add up to more than"),
        ([5, -1], ValueError, r"lengths\[1\] is negative \(-1\)"),
        ([2**70], OverflowError, "cannot fit .int. into an index-sized integer"),
        ([1.5], TypeError, "'float' object cannot be interpreted as an integer"),
        (["3"], TypeError, "'str' object cannot be interpreted as an integer"),
        ([None], TypeError, "'NoneType' object cannot be interpreted as an integer"),
        (5, TypeError, "lengths must be a sequence of ints or a buffer of uint32"),
        (None, TypeError, "lengths must be a sequence of ints"),
        (b"\x01\x02", TypeError, r"a lengths buffer must be a one-dimensional array of uint32 \(format 'I'\), not format 'B'"),
        (array.array("H", [1, 2]), TypeError, "not format 'H'"),
        (array.array("i", [1, 2]), TypeError, "not format 'i'"),
        (np.array([1, 2], dtype=np.uint64), TypeError, "uint32"),
        (np.array([[1, 2]], dtype=np.uint32), TypeError, "in 2 dimensions"),
    ],
)
def test_bad_lengths(lengths, exc, match):
    data = bytearray(100)
    with pytest.raises(exc, match=match):
        _native.blake3_many(data, lengths)
    assert not _native.bytearray_exported(data)


def test_uint32_lengths_too_long_release_both_buffers():
    data = bytearray(100)
    lens = array.array("I", [50, 51])
    with pytest.raises(ValueError, match="add up to more than the buffer's 100 bytes"):
        _native.blake3_many(data, lens)
    assert _released(data, lens)
    assert _native.blake3_many(data, lens[:1]) == ref(bytes(50))
    assert _released(data, lens)


@pytest.mark.parametrize("bad", ["text", 123, None, [1, 2, 3], object()])
def test_non_buffer_data(bad):
    with pytest.raises(TypeError):
        _native.blake3_many(bad, [])


def test_non_contiguous_buffer_refused():
    strided = memoryview(bytes(100))[::2]
    with pytest.raises(BufferError):
        _native.blake3_many(strided, [1])


def test_wrong_argument_count():
    with pytest.raises(TypeError):
        _native.blake3_many(b"abc")
    with pytest.raises(TypeError):
        _native.blake3_many(b"abc", [1], [2])
    with pytest.raises(TypeError):
        _native.blake3_many()


def test_threads_hash_at_once():
    """Threads in blake3_many at once (the GIL is released while hashing) get the same
    digests as one thread, each for its own batch."""
    rng = random.Random(7)
    batches = []
    for _ in range(8):
        data = rng.randbytes(rng.randrange(1 << 20, 3 << 20))
        lengths, left = [], len(data)
        while left:
            n = min(left, rng.choice([0, 1, 1000, 64 * KiB, 300 * KiB]))
            lengths.append(n)
            left -= n
        batches.append((data, lengths, ref_many(data, lengths)))
    start = threading.Barrier(8)

    def work(i):
        data, lengths, want = batches[i]
        start.wait()
        for _ in range(5):
            if _native.blake3_many(data, lengths) != want or one(data) != ref(data):
                return False
        return True

    with ThreadPoolExecutor(8) as pool:
        assert all(pool.map(work, range(8)))
