"""The daemon's GIL switch interval (cowfs/fs/mount.py): 1 ms unless COWFS_GIL_SWITCH_MS says
otherwise, and a bad value is a one-line error before any daemon starts."""
from __future__ import annotations

import pytest

from cowfs.fs.mount import GIL_SWITCH_ENV, MountError, gil_switch_interval


def test_gil_switch_interval_from_the_environment() -> None:
    assert gil_switch_interval({}) == 0.001
    assert gil_switch_interval({GIL_SWITCH_ENV: "0.5"}) == 0.0005
    for bad in ("0", "-1", "abc", "1000", ""):
        with pytest.raises(MountError, match=GIL_SWITCH_ENV):
            gil_switch_interval({GIL_SWITCH_ENV: bad})
