"""Build and install pyfuse3 with cowfs's patch (native/pyfuse3/cowfs.patch).

    python tools/pyfuse3_build.py [--sdist FILE] [--offline] [--force]

Run by `make setup` with the venv's python, which it installs into. Steps:
1. the pinned source release (pyfuse3 3.5.0): downloaded by pip, or the --sdist given; its
   sha256 must be the pinned one;
2. unpacked in a temporary directory; the C file Cython generated for the release is deleted,
   so that the build has to run Cython over the patched .pyx (a build that fell back to the
   shipped C would silently be the stock one);
3. the patch applied with patch(1), which must apply cleanly;
4. `pip install --no-deps` with the version `3.5.0+cowfs.gil3` (cowfs.fs.binding); with
   --offline, without build isolation (Cython, setuptools and setuptools_scm must then be
   installed already, nothing is fetched);
5. checked: the interpreter imports pyfuse3 with that version.

Does nothing when that version is installed already (unless --force). Every failure is one
line on stderr and exit status 1; the pyfuse3 installed before stays unless step 4 replaced it.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from cowfs.fs.binding import PATCHED_RELEASE, patched_version  # noqa: E402

PATCH = REPO / "native" / "pyfuse3" / "cowfs.patch"
SDIST_NAME = f"pyfuse3-{PATCHED_RELEASE}.tar.gz"
SDIST_SHA256 = "88399a9494b88603230bba300f4ba9ad63fece5ed514ca3633d555a0c6a42b24"
GENERATED_C = Path("src") / "pyfuse3" / "__init__.c"


class BuildError(Exception):
    pass


def run(cmd: list[str], what: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        tail = (r.stderr.strip() or r.stdout.strip()).splitlines()[-1:] or ["(no output)"]
        raise BuildError(f"{what} failed (exit {r.returncode}): {tail[0]}")
    return r.stdout


def installed_version(python: str) -> str:
    r = subprocess.run([python, "-c", "import importlib.metadata as m; print(m.version('pyfuse3'))"],
                       capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else ""


def fetch_sdist(python: str, into: Path) -> Path:
    run([python, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--no-input",
         "-d", str(into), f"pyfuse3=={PATCHED_RELEASE}"], "downloading the pyfuse3 source release")
    found = into / SDIST_NAME
    if not found.is_file():
        raise BuildError(f"pip download gave no {SDIST_NAME} in {into}")
    return found


def check_sdist(sdist: Path) -> None:
    digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
    if digest != SDIST_SHA256:
        raise BuildError(f"{sdist}: sha256 {digest}, not the pinned {SDIST_SHA256} of {SDIST_NAME}")


def unpack(sdist: Path, into: Path) -> Path:
    with tarfile.open(sdist) as tar:
        tar.extractall(into, filter="data")
    top = into / f"pyfuse3-{PATCHED_RELEASE}"
    if not (top / "pyproject.toml").is_file():
        raise BuildError(f"{sdist}: no pyfuse3-{PATCHED_RELEASE}/pyproject.toml inside")
    return top


def patch_source(top: Path) -> None:
    (top / GENERATED_C).unlink(missing_ok=True)
    run(["patch", "-p1", "--forward", "--batch", "--no-backup-if-mismatch", "-i", str(PATCH)],
        f"applying {PATCH.name}", cwd=top)


def install(python: str, top: Path, offline: bool) -> None:
    env = dict(os.environ, SETUPTOOLS_SCM_PRETEND_VERSION=patched_version())
    cmd = [python, "-m", "pip", "install", "--no-deps", "--force-reinstall", "--no-input", "--no-cache-dir"]
    if offline:
        r = subprocess.run([python, "-c", "import Cython"], capture_output=True)
        if r.returncode != 0:
            raise BuildError("--offline needs Cython installed in that python (the patched .pyx must be compiled)")
        cmd += ["--no-index", "--no-build-isolation"]
    run(cmd + [str(top)], "building and installing the patched pyfuse3", env=env)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sdist", type=Path, help=f"a local {SDIST_NAME} instead of downloading it")
    ap.add_argument("--offline", action="store_true", help="fetch nothing: no download, no build isolation")
    ap.add_argument("--force", action="store_true", help="build even when the patched version is installed")
    ap.add_argument("--python", default=sys.executable, help="the interpreter to install into (default: this one)")
    args = ap.parse_args(argv)
    want = patched_version()
    try:
        if not args.force and installed_version(args.python) == want:
            print(f"pyfuse3 {want} is installed already")
            return 0
        if args.offline and args.sdist is None:
            raise BuildError("--offline needs --sdist")
        with tempfile.TemporaryDirectory(prefix="cowfs-pyfuse3-") as tmp:
            work = Path(tmp)
            sdist = args.sdist if args.sdist is not None else fetch_sdist(args.python, work / "dl")
            check_sdist(sdist)
            top = unpack(sdist, work / "src")
            patch_source(top)
            install(args.python, top, args.offline)
        got = installed_version(args.python)
        if got != want:
            raise BuildError(f"after the install the interpreter reports pyfuse3 {got or 'missing'}, not {want}")
    except (BuildError, OSError, tarfile.TarError) as e:
        print(f"pyfuse3_build: {e}", file=sys.stderr)
        return 1
    print(f"pyfuse3 {want} installed (GIL released around its copies; max_write settable; queued requests taken without a wait)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
