"""`keep_freed_memory`: glibc's malloc told to keep freed memory for reuse (mallopt(3)), which
both daemons need: they allocate and free large buffers at a steady rate (a store's daemon a
batch of 1 MiB WRITE buffers every 8 MiB; a consumer's a 4 MiB block per fetch), and by
default glibc gives that memory back to the kernel, so every buffer costs fresh pages (page
faults and zeroing). A C library without mallopt is left as it is."""
from __future__ import annotations

import ctypes

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt(3)'s parameters


def keep_freed_memory(heap_below: int, keep_freed: int) -> None:
    """Allocations smaller than `heap_below` come from the heaps (not a mmap of their own),
    and a heap keeps up to `keep_freed` bytes of freed memory at its top."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(M_MMAP_THRESHOLD, heap_below)
    mallopt(M_TRIM_THRESHOLD, keep_freed)
