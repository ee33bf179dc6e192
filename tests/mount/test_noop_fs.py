"""The benchmark's no-op FUSE file system (tools/bench/noop_fs.py): it mounts, serves the
small-file workload, and unmounts by itself."""
from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.mount


def test_the_no_op_file_system_serves_small_files_and_unmounts():
    from tools.bench import noop_fs

    rates = noop_fs.small_files_rate(500, 2, 2)
    assert len(rates) == 2 and all(files_s > 0 and cpu_ms >= 0 for files_s, cpu_ms in rates)
    with open("/proc/self/mounts") as f:
        assert "noopfs" not in f.read()


def test_the_no_op_file_system_serves_a_file_by_pread_and_times_cold_reads(tmp_path):
    from tools.bench import noop_fs

    blob = os.urandom((8 << 20) + 123)
    (tmp_path / "f").write_bytes(blob)
    with noop_fs._mounted(tmp_path / "f") as (mnt, _pid):
        assert (mnt / "served").read_bytes() == blob
    rates = noop_fs.cold_read_rate(tmp_path / "f", 2)
    assert len(rates) == 2 and all(noop > 0 and disk > 0 and cpu >= 0 for noop, disk, cpu in rates)
    with open("/proc/self/mounts") as f:
        assert "noopfs" not in f.read()
