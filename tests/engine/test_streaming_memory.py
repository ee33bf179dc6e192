"""A write session's memory stays bounded however large the file it writes.

A 512 MiB file is written in 1 MiB pieces through one write session, once
sequentially (the streaming fast path: batches chunked in the background) and
once at scattered offsets (the slow path: writes go to the overlay spill file
and commit re-chunks them). Both runs must keep the peak of Python allocations
(tracemalloc) under 64 MiB and the growth of the process's peak RSS
(getrusage ru_maxrss) under 128 MiB, an eighth and a quarter of the file. The
file is then read back with open_reader in 1 MiB pieces and its checksum must
equal the one computed while writing.

The workload runs in a fresh interpreter (this file run as a script) so the
RSS high-water mark belongs to it alone; the store comes from the store_path
fixture, which fscks it afterwards.
"""
from __future__ import annotations

import hashlib
import json
import random
import resource
import struct
import subprocess
import sys
import time
import tracemalloc

MiB = 1 << 20
PIECE = MiB
FILE_SIZE = 512 * MiB
ALLOC_CAP = 64 * MiB  # peak Python allocations while writing or reading
RSS_CAP = 128 * MiB  # growth of the peak resident set size over the whole run
STAMP_EVERY = 4096  # < the 16 KiB minimum chunk: no two chunks are alike, nothing dedups


class Pieces:
    """1 MiB pieces of a file that never repeats: one random block, stamped with (piece, slot) every 4 KiB."""

    def __init__(self) -> None:
        self._buf = bytearray(random.Random(1234).randbytes(PIECE))

    def __call__(self, index: int) -> bytes:
        buf = self._buf
        for slot in range(PIECE // STAMP_EVERY):
            struct.pack_into("<QQ", buf, slot * STAMP_EVERY, index, slot)
        return bytes(buf)


def checksum(digests: list[bytes]) -> str:
    return hashlib.sha256(b"".join(digests)).hexdigest()


def workload(store_path: str, mode: str) -> dict:
    from cowfs.store import ROOT_INO, Store

    n = FILE_SIZE // PIECE
    order = list(range(n))
    if mode == "scattered":
        random.Random(7).shuffle(order)
    make = Pieces()
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    tracemalloc.start()
    t0 = time.monotonic()
    with Store.open(store_path) as store:
        ino = store.create(ROOT_INO, b"big.bin").ino
        digests: list[bytes] = [b""] * n
        with store.open_session(ino) as s:
            for i in order:
                data = make(i)
                digests[i] = hashlib.sha256(data).digest()
                assert s.write(i * PIECE, data) == PIECE
            streamed = s.streaming
            attr = s.commit()
        _, write_peak = tracemalloc.get_traced_memory()
        t1 = time.monotonic()
        tracemalloc.reset_peak()
        assert attr is not None and attr.size == FILE_SIZE
        got: list[bytes] = []
        with store.open_reader(ino) as r:
            assert r.size == FILE_SIZE
            for off in range(0, FILE_SIZE, PIECE):
                got.append(hashlib.sha256(r.read(off, PIECE)).digest())
        _, read_peak = tracemalloc.get_traced_memory()
        stats = store.stats()
    tracemalloc.stop()
    rss_growth = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss_before
    return {
        "mode": mode,
        "streamed": streamed,
        "written": checksum(digests),
        "read": checksum(got),
        "write_peak": write_peak,
        "read_peak": read_peak,
        "rss_growth": rss_growth,
        "stored_bytes": stats["stored_bytes"],
        "write_s": round(t1 - t0, 2),
        "read_s": round(time.monotonic() - t1, 2),
    }


def run_in_subprocess(store_path, mode: str) -> dict:
    proc = subprocess.run(
        [sys.executable, __file__, str(store_path), mode], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, f"workload failed:\n{proc.stdout}\n{proc.stderr}"
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    print(result)
    return result


def check(result: dict) -> None:
    mib = {k: round(result[k] / MiB, 1) for k in ("write_peak", "read_peak", "rss_growth")}
    assert result["read"] == result["written"], "read-back checksum differs from the one computed while writing"
    assert result["stored_bytes"] >= FILE_SIZE, f"data deduplicated ({result['stored_bytes']} bytes stored): the test data repeats"
    assert result["write_peak"] < ALLOC_CAP, f"write: peak Python allocations {mib['write_peak']} MiB for a {FILE_SIZE >> 20} MiB file"
    assert result["read_peak"] < ALLOC_CAP, f"read: peak Python allocations {mib['read_peak']} MiB"
    assert result["rss_growth"] < RSS_CAP, f"peak RSS grew by {mib['rss_growth']} MiB for a {FILE_SIZE >> 20} MiB file"


def test_sequential_write_memory_is_bounded(store_path):
    result = run_in_subprocess(store_path, "sequential")
    assert result["streamed"], "sequential 1 MiB writes from offset 0 left the streaming fast path"
    check(result)


def test_scattered_write_memory_is_bounded(store_path):
    result = run_in_subprocess(store_path, "scattered")
    assert not result["streamed"], "scattered writes should go through the overlay (slow path)"
    check(result)


if __name__ == "__main__":
    print(json.dumps(workload(sys.argv[1], sys.argv[2])))
