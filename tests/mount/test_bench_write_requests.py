"""tools/bench/write_requests.py: each workload through a real mount, a table row per workload
and arm; bad arguments refused in one line."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tools import harnessutil
from tools.bench.write_requests import WORKLOADS, main, parse_arm

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.mount


def test_every_workload_and_arm_gets_a_row(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--gib", "0.03125", "--files", "40", "--reps", "1", "--work", str(tmp_path / "w")]) == 0
    rows = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| ") and "---" not in ln][1:]
    assert [r.split(" | ")[0][2:] for r in rows] == list(WORKLOADS)
    for r in rows:
        mb_s, trio, daemon = (float(c.split()[0]) for c in r.split(" | ")[2:5])
        assert mb_s > 0 and 0 < trio <= daemon
    assert not (tmp_path / "w" / "src.bin").exists() and not (tmp_path / "w" / "arm0" / "store").exists()


@pytest.mark.parametrize("args, message", [(["--reps", "0"], "--reps and --files must be 1 or more"),
                                           (["--files", "0"], "--reps and --files must be 1 or more"),
                                           (["--code", "/nonexistent"], "no cowfs/ there"),
                                           (["--code", f"/nonexistent:{REPO}"], "/nonexistent is not a directory")])
def test_bad_arguments_are_refused_in_one_line(args: list[str], message: str) -> None:
    r = subprocess.run([sys.executable, "-m", "tools.bench.write_requests", *args], capture_output=True, text=True,
                       cwd=REPO)
    assert r.returncode == 2 and message in r.stderr and r.stderr.strip().splitlines()[-1].count(message) == 1


def test_an_arm_puts_its_directories_before_its_tree_on_pythonpath(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """`--code DIR:TREE`: another pyfuse3 build in DIR, imported before the venv's."""
    tree, build = tmp_path / "tree", tmp_path / "pyfuse3-build"
    assert parse_arm(f"{build}:{tree}") == (tree, (build,))
    assert parse_arm(str(tree)) == (tree, ())
    seen: dict[str, object] = {}

    def fake_run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        seen.update(kw)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(harnessutil.subprocess, "run", fake_run)
    harnessutil.run_cowfs("ls", "x", code=tree, before=(build,))
    assert seen["env"]["PYTHONPATH"] == f"{build}:{tree}" and seen["cwd"] == tree  # type: ignore[index]
