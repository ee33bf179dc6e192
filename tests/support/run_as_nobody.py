"""Run a cowfs command as the unprivileged user (nobody), wherever the checkout lives.

`setpriv --reuid=65534 ... python -m cowfs.cli` needs nobody to reach the interpreter, its
standard library, the venv and the checkout. Under a directory of mode 0700 (root's home, where
a clone or pyenv's Python may sit) it cannot, and the command dies with ModuleNotFoundError
before it checks anything. So this launcher starts as root, imports all of cowfs and what the
commands import later, then drops to nobody (no supplementary groups, then the group, then the
user: what setpriv --clear-groups --regid --reuid does) and only then runs cowfs.cli.main: every
permission check the command makes is nobody's, and nothing is read from the checkout or the
interpreter's directories as nobody.

Every import after the drop fails (ImportError), wherever the checkout lives, and the launcher
names it on stderr at exit, so a command that grows a lazy import fails its test here too, not
only in a locked directory: add the module to LATE_IMPORTS.

    python tests/support/run_as_nobody.py ARGS...   (as root; as `cowfs ARGS...` run by nobody)
"""
from __future__ import annotations

import atexit
import ctypes
import importlib
import importlib.abc
import importlib.machinery
import os
import pkgutil
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

NOBODY_UID = 65534
NOGROUP_GID = 65534
PR_SET_DUMPABLE = 4  # <linux/prctl.h>
# what the commands import only when they get there, outside cowfs (all of cowfs is imported
# anyway): the codec cowfs.mountinfo decodes mount fields with, which the codec registry
# imports at its first use (only when some cowfs filesystem is mounted on the machine)
LATE_IMPORTS: tuple[str, ...] = ("encodings.unicode_escape",)


def cowfs_command_as_nobody(*args: str) -> list[str]:
    """The command line that runs `cowfs ARGS` as nobody (started as root)."""
    return [sys.executable, str(Path(__file__).resolve()), *args]


# what no command imports: the frameworks' plug-ins (they import torch and lightning, seconds
# per start; a command that imported them after all would fail on the import guard)
NOT_COMMANDS: tuple[str, ...] = ("cowfs.plugins", "cowfs.dcp", "cowfs.lightning")


def import_package(name: str) -> None:
    """`name` and every module and package under it, but NOT_COMMANDS."""
    package = importlib.import_module(name)
    for info in pkgutil.walk_packages(package.__path__, f"{name}.",
                                      onerror=lambda _name: None):
        skip = any(info.name == n or info.name.startswith(n + ".") for n in NOT_COMMANDS)
        if not info.name.endswith(".__main__") and not skip:
            importlib.import_module(info.name)


class ImportsAfterDrop(importlib.abc.MetaPathFinder):
    """Refuses every import that is not built into the interpreter, and remembers it."""

    def __init__(self) -> None:
        self.refused: list[str] = []

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname in sys.builtin_module_names or importlib.machinery.FrozenImporter.find_spec(fullname):
            return None  # nothing to read from the file system
        self.refused.append(fullname)
        raise ImportError(f"{fullname} imported after dropping to nobody: add it to LATE_IMPORTS in {__file__}",
                          name=fullname)

    def report(self) -> None:
        if self.refused:
            print(f"run_as_nobody: imported after dropping to nobody: {', '.join(self.refused)}", file=sys.stderr)


def drop_to_nobody() -> None:
    """Become nobody:nogroup with no supplementary groups and no capabilities (root loses them
    all when its user ids change), dumpable again as after an exec."""
    libc = ctypes.CDLL(None, use_errno=True)
    os.setgroups([])
    os.setgid(NOGROUP_GID)
    os.setuid(NOBODY_UID)
    if libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE)")
    with open("/proc/self/status") as f:
        capabilities = {k: int(v, 16) for k, v in (line.split(":") for line in f) if k in ("CapPrm", "CapEff")}
    if (os.getresuid() != (NOBODY_UID,) * 3 or os.getresgid() != (NOGROUP_GID,) * 3 or os.getgroups()
            or any(capabilities.values()) or len(capabilities) != 2):
        raise RuntimeError(f"could not drop to nobody: {os.getresuid()=} {os.getresgid()=} {capabilities=}")


def main(argv: list[str]) -> int:
    if os.geteuid() != 0:
        raise SystemExit("run_as_nobody: must start as root")
    import_package("cowfs")
    for name in LATE_IMPORTS:
        importlib.import_module(name)
    from cowfs.cli import main as cowfs_main

    drop_to_nobody()
    guard = ImportsAfterDrop()
    sys.meta_path.insert(0, guard)
    atexit.register(guard.report)
    return cowfs_main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
