"""The same checkpoint series stored by restic and by borg, for tools/bench/codecs.py.

restic: `restic init` (throwaway password in RESTIC_PASSWORD, repository version 2, which
compresses with zstd; `--compression auto`), then one `restic backup VERSION_DIR` per
checkpoint, oldest first. borg: `borg init --encryption=none`, then one
`borg create --compression zstd,3 REPO::NAME VERSION_DIR` per checkpoint. Both deduplicate
with content-defined chunks across all backups. The result is the repository's size on
disk (sum of its file sizes) over the series' logical size. A tool that is not installed
is skipped (`None`).

A bench tool: cowfs/ never imports it.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from .pieces import version_dirs


def _tree_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _version(cmd: list[str]) -> str:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return "?"
    return " ".join((r.stdout or r.stderr).split()[:2])  # "restic 0.14.0", "borg 1.2.4"


def _run(cmd: list[str], cwd: Path, env: dict[str, str]) -> None:
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {r.returncode}: {r.stderr.strip()[-500:]}")


def restic(series: Path, repo: Path) -> dict[str, Any] | None:
    exe = shutil.which("restic")
    if exe is None:
        return None
    env = dict(os.environ, RESTIC_PASSWORD="cowfs-bench-throwaway", RESTIC_CACHE_DIR=str(repo) + ".cache")
    shutil.rmtree(repo, ignore_errors=True)
    t0 = time.perf_counter()
    _run([exe, "init", "--repo", str(repo), "--repository-version", "2"], series, env)
    for v in version_dirs(series):
        _run([exe, "--repo", str(repo), "backup", "--compression", "auto", "--quiet", v.name], series, env)
    out = {"tool": _version([exe, "version"]), "repo_bytes": _tree_bytes(repo),
           "seconds": round(time.perf_counter() - t0, 1), "settings": "repository v2, --compression auto"}
    shutil.rmtree(repo, ignore_errors=True)
    shutil.rmtree(str(repo) + ".cache", ignore_errors=True)
    return out


def borg(series: Path, repo: Path) -> dict[str, Any] | None:
    exe = shutil.which("borg")
    if exe is None:
        return None
    env = dict(os.environ, BORG_UNKNOWN_UNENCRYPTED_REPO_ACCESS_IS_OK="yes",
               BORG_BASE_DIR=str(repo) + ".base")
    shutil.rmtree(repo, ignore_errors=True)
    t0 = time.perf_counter()
    _run([exe, "init", "--encryption=none", str(repo)], series, env)
    for v in version_dirs(series):
        _run([exe, "create", "--compression", "zstd,3", f"{repo}::{v.name}", v.name], series, env)
    out = {"tool": _version([exe, "--version"]), "repo_bytes": _tree_bytes(repo),
           "seconds": round(time.perf_counter() - t0, 1), "settings": "--encryption=none, --compression zstd,3"}
    shutil.rmtree(repo, ignore_errors=True)
    shutil.rmtree(str(repo) + ".base", ignore_errors=True)
    return out


def measure(series: Path, work: Path) -> dict[str, dict[str, Any] | None]:
    work.mkdir(parents=True, exist_ok=True)
    return {"restic": restic(series, work / "restic-repo"), "borg": borg(series, work / "borg-repo")}
