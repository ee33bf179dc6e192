"""CLI commands on a mounted store go through its daemon (TARGET = mountpoint or store)."""
from __future__ import annotations

import json
import os

import pytest

from tests.support.mountutil import cowfs, mounted
from tests.support.storeutil import data

pytestmark = pytest.mark.mount


def test_commands_on_a_mounted_store(store_path, tmp_path):
    with mounted(store_path, tmp_path / "mnt") as m:
        (m / "run").mkdir()
        (m / "run" / "model.pt").write_bytes(data(2_000_000, 1))
        for target in (str(m), str(store_path)):
            st = json.loads(cowfs("stats", target, "--json").stdout)
            assert st["files"] == 1 and st["logical_bytes"] == 2_000_000
        cowfs("snapshot", "create", str(m), "one")
        assert os.listdir(m / ".snapshots") == ["one"]  # made through the daemon, visible in the mount
        snaps = json.loads(cowfs("snapshot", "list", str(m), "--json").stdout)
        assert [s["name"] for s in snaps] == ["one"] and snaps[0]["generation"] > 0
        (m / "run" / "model.pt").write_bytes(data(2_000_000, 2))
        assert cowfs("cat", str(m), "/run/model.pt", "--snapshot", "one").stdout == data(2_000_000, 1)
        log = json.loads(cowfs("log", str(m), "/run/model.pt", "--json").stdout)
        assert [v["size"] for v in log] == [2_000_000, 2_000_000] and log[0]["current"]
        assert cowfs("cat", str(m), "/run/model.pt", "--generation", str(log[1]["generation"])).stdout == data(2_000_000, 1)
        assert b"model.pt" in cowfs("ls", str(m), "/run", "--snapshot", "one").stdout
        (m / "run" / "model.pt").unlink()
        cowfs("snapshot", "delete", str(m), "one")
        assert not (m / ".snapshots" / "one").exists()  # the kernel's cached entry was invalidated
        r = cowfs("gc", str(m))
        assert b"freed" in r.stdout
        assert json.loads(cowfs("gc", str(m), "--json").stdout)["bytes_freed"] >= 0
        assert (m / "run").is_dir()  # the mount keeps working after gc
        r = cowfs("fsck", str(store_path), "--json")  # checked through the daemon
        assert json.loads(r.stdout)["clean"]
        r = cowfs("snapshot", "delete", str(m), "nope", check=False)
        assert r.returncode == 2 and b"no snapshot named" in r.stderr and b"Traceback" not in r.stderr
