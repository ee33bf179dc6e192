"""With the kernel's writeback cache, a file written in writes that end mid-page (torch.save:
4 MiB of tensor, 64 bytes of zip header, and so on) reaches the daemon with pages sent
twice and late. The write session takes them on its stream (reorder.py): the spill file
gets at most a few late pages (patches), never the rest of the file, and the bytes read back
whole."""
from __future__ import annotations

import os

from tests.support.mountutil import daemon_pid, mounted
from tools.bench.mounting import spilled_bytes

MiB = 1 << 20


def test_unaligned_writes_through_the_writeback_cache_stay_on_the_stream(store_path, tmp_path):
    parts = [os.urandom(1152)]
    for i in range(64):  # 256 MiB: the kernel writes pages back while the file is still written
        parts += [os.urandom(4 * MiB), os.urandom(64)]
    want = b"".join(parts)
    with mounted(store_path, tmp_path / "mnt", "--writeback-cache") as m:
        pid = daemon_pid(store_path)
        with open(m / "model.pt", "wb") as f:
            for p in parts:
                f.write(p)
                f.flush()
            assert spilled_bytes(pid) < MiB  # the pages sent so far joined the stream, a late one is a patch
            os.fsync(f.fileno())
            assert spilled_bytes(pid) < MiB
        assert (m / "model.pt").read_bytes() == want
