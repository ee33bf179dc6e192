"""The CLI starts without the engine or FUSE where it needs neither: a command that goes to a
mounted store's daemon, and `cowfs umount` (cowfs/unmount.py)."""
from __future__ import annotations

import subprocess
import sys
import time

from cowfs.unmount import wait_for_exit

HEAVY = ("cowfs.store.store", "cowfs.service", "pyfuse3", "trio", "numpy")


def imported_after(statement: str) -> set[str]:
    code = f"import sys; {statement}; print(' '.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return set(out.split())


def test_the_cli_and_umount_do_not_import_the_engine_or_fuse() -> None:
    for statement in ("import cowfs.cli", "import cowfs.unmount",
                      "from cowfs.control import DaemonTarget, open_target",
                      "from cowfs.store.log.layout import read_config"):
        assert not imported_after(statement) & set(HEAVY), statement


def test_the_stores_names_load_when_first_used() -> None:
    modules = imported_after("from cowfs.store import Store, Snapshot, ROOT_INO")
    assert "cowfs.store.store" in modules and "cowfs.store.catalog.snapshots" in modules
    r = subprocess.run([sys.executable, "-c", "import cowfs.store as s; s.NoSuchName"], capture_output=True, text=True)
    assert r.returncode == 1 and "has no attribute 'NoSuchName'" in r.stderr


def test_wait_for_exit_returns_when_the_process_has_exited_and_not_before() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        t0 = time.monotonic()
        assert not wait_for_exit(proc.pid, 0.2)  # still running: the timeout
        assert time.monotonic() - t0 >= 0.2
        proc.stdin.close()  # type: ignore[union-attr]
        assert wait_for_exit(proc.pid, 60)  # exited (a zombie until reaped counts as exited)
    finally:
        proc.kill()
        proc.wait()
    assert wait_for_exit(proc.pid, 1)  # reaped: no such process
