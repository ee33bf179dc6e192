"""The pyfuse3 build (cowfs/fs/binding.py, tools/pyfuse3_build.py): `make setup` installs the
one built with native/pyfuse3/cowfs.patch, and the builder refuses bad inputs with one
line, changing nothing."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cowfs.fs.binding import PATCH_LABEL, describe, patched_version, pyfuse3_version, is_patched

REPO = Path(__file__).resolve().parents[2]
BUILDER = REPO / "tools" / "pyfuse3_build.py"


def test_the_label_tells_the_patched_build() -> None:
    assert is_patched(f"3.5.0+{PATCH_LABEL}")
    assert patched_version().endswith("+" + PATCH_LABEL)
    for stock in ("3.5.0", "3.5.0+local", "unknown", f"3.5.0+{PATCH_LABEL}x"):
        assert not is_patched(stock)
        assert "stock" in describe(stock)
    assert "without the GIL" in describe(patched_version())


def test_make_setup_installed_the_patched_build() -> None:
    # the suite runs in the venv `make setup` made; a stock pyfuse3 here means its build step failed
    assert pyfuse3_version() == patched_version(), describe()
    import pyfuse3
    assert Path(pyfuse3.__file__).resolve().is_relative_to(Path(sys.prefix).resolve())


def _build(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # --python: a file that is no interpreter, so that nothing can be installed anywhere
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\nexit 3\n")
    fake.chmod(0o755)
    return subprocess.run([sys.executable, str(BUILDER), "--python", str(fake), *args],
                          capture_output=True, text=True, timeout=120)


def test_builder_refuses_a_wrong_source_release(tmp_path: Path) -> None:
    bogus = tmp_path / "pyfuse3-3.5.0.tar.gz"
    bogus.write_bytes(b"not the release")
    r = _build(tmp_path, "--offline", "--sdist", str(bogus))
    assert r.returncode == 1
    assert r.stdout == ""
    assert r.stderr.count("\n") == 1 and "sha256" in r.stderr and "not the pinned" in r.stderr


def test_builder_offline_needs_a_source_release(tmp_path: Path) -> None:
    r = _build(tmp_path, "--offline")
    assert r.returncode == 1
    assert r.stderr.strip() == "pyfuse3_build: --offline needs --sdist"


def test_the_patch_changes_only_the_copies_max_write_and_the_wait() -> None:
    # `with nogil:` around the three copies; Operations.max_write passed to libfuse in
    # fuse_init; the session loop takes a queued request at once, from a non-blocking fd, waits
    # for the fd only on EAGAIN, and starts no task while one is yet to run; no other line changes
    lines = (REPO / "native" / "pyfuse3" / "cowfs.patch").read_text().splitlines()
    removed = [ln[1:].strip() for ln in lines if ln.startswith("-") and not ln.startswith("---")]
    added = [ln[1:].strip() for ln in lines if ln.startswith("+") and not ln.startswith("+++")]
    added = [a.split("  #")[0] for a in added if a and not a.startswith("#")]  # without comments
    max_write = ["max_write: int = 0", "if 0 < operations.max_write < conn.max_write:",
                 "conn.max_write = operations.max_write"]
    receive_first = ["os.set_blocking(session_fd, False)", "cdef int requests_per_yield = 8",
                     "cdef int unyielded = 0", "if res == -errno.EAGAIN:", "unyielded = 0",
                     "if not await _wait_fuse_readable():", "break", "continue", "unyielded += 1",
                     "if unyielded >= requests_per_yield:", "unyielded = 0",
                     "await trio.lowlevel.checkpoint()",
                     # a task that has not run yet counts as one that will wait: no new one for it
                     "cdef int starting", "self.starting = 0", "if worker_data.starting:",
                     "worker_data.starting -= 1", "if (not worker_data.active_readers and not worker_data.starting",
                     "and worker_data.task_count < max_tasks):", "worker_data.starting += 1"]
    copies = [r for r in removed if "(" in r and "=" in r]
    assert {r.split("=", 1)[1].split("(", 1)[0].strip() for r in copies} == {
        "fuse_buf_copy", "fuse_session_receive_buf", "fuse_reply_buf"}
    assert sorted(removed) == sorted(copies + ["if not await _wait_fuse_readable():", "break", "",
                                               "if not worker_data.active_readers and worker_data.task_count < max_tasks:"])
    rest = list(added)
    for line in copies + ["with nogil:"] * 3 + max_write + receive_first:
        rest.remove(line)  # raises if the patch lacks it
    assert rest == []


def test_the_patched_build_has_max_write() -> None:
    import pyfuse3
    assert pyfuse3.Operations.max_write == 0  # libfuse's own size unless a file system asks


@pytest.mark.mount
def test_the_daemon_says_which_build_serves_the_mount(store_path: Path, tmp_path: Path) -> None:
    from tests.support.mountutil import mounted
    with mounted(store_path, tmp_path / "mnt"):
        pass
    line = next(ln for ln in (store_path / "cowfs.log").read_text().splitlines() if " mounted " in ln)
    assert describe() in line and "copies without the GIL" in line
