"""The store's daemon fixes glibc's malloc thresholds (fs/heap.py `keep_freed_memory` with
fs/mount.py's HEAP_BELOW and KEEP_FREED): 1 MiB
WRITE-sized buffers allocated and freed a batch at a time stay mapped instead of being given
back to the kernel and faulted in again. Measured in a child process, with and without."""
from __future__ import annotations

import subprocess
import sys

CHILD = r"""
import resource, sys
if sys.argv[1] == "fixed":
    from cowfs.fs.heap import keep_freed_memory
    from cowfs.fs.mount import HEAP_BELOW, KEEP_FREED
    keep_freed_memory(HEAP_BELOW, KEEP_FREED)
def batch():
    bufs = [bytearray(1 << 20) for _ in range(8)]  # a batch of 1 MiB WRITE buffers, touched
    for b in bufs:
        b[::4096] = b"\1" * len(range(0, len(b), 4096))
    return bufs
batch()  # warm up: glibc's adaptive threshold rises to these sizes here
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(32):
    batch()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> int:
    r = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, timeout=120, check=True)
    return int(r.stdout)


def test_freed_write_buffers_stay_mapped() -> None:
    adaptive, fixed = _faults("adaptive"), _faults("fixed")
    pages = 32 * 8 * 256  # every page of every batch faulted in again
    assert adaptive > pages // 2, adaptive  # glibc gives the heap top back after each batch
    assert fixed < pages // 20, fixed
