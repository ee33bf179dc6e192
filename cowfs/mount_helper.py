"""`mount.cowfs`: the helper mount(8) runs for `mount -t fuse.cowfs` and /etc/fstab lines.

For type fuse.cowfs, util-linux mount(8) runs /sbin/mount.fuse.cowfs (found before
/sbin/mount.fuse, which would run a program named `cowfs` with mount.fuse3's arguments)
as `mount.fuse.cowfs STORE MOUNTPOINT [-s] [-f] [-n] [-v] [-o OPTIONS]`. This module turns
OPTIONS into `cowfs mount` flags, derived from that command's argparse parser so a flag it
grows is a mount option at once (`--snapshot-on X` is `snapshot_on=X`), and runs `cowfs
mount` in this process: it forks the daemon and returns once the mount is live.
`mount.cowfs --install` links /sbin/mount.fuse.cowfs to this package's script.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import shlex
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, NoReturn, Sequence

from .errors import CowfsError, InvalidArgument

PROG = "mount.cowfs"
SCRIPT_NAME = "mount.cowfs"  # the console script ([project.scripts] in pyproject.toml)
HELPER_LINK = Path("/sbin/mount.fuse.cowfs")  # what mount(8) runs for -t fuse.cowfs
EX_USAGE = 1  # mount(8)'s codes, which it passes on from a helper: incorrect invocation
EX_FAIL = 32  # mount failure
EX_INTERRUPTED = 8

# Options for mount(8), fstab and systemd, not for the file system: accepted, ignored.
USERSPACE = frozenset({"defaults", "auto", "noauto", "nofail", "_netdev", "user", "users", "nouser",
                       "owner", "group"})
USERSPACE_PREFIXES = ("x-", "comment=", "user=")
# Kernel mount flags that libfuse applies to the FUSE mount: passed on.
VFS_PASSED = frozenset({"rw", "nosuid", "suid", "nodev", "dev", "noexec", "exec", "noatime", "atime",
                        "sync", "async", "dirsync"})
# Kernel mount flags that libfuse does not take: accepted, the mount keeps FUSE's defaults.
VFS_IGNORED = frozenset({"relatime", "norelatime", "strictatime", "nostrictatime", "lazytime", "nolazytime",
                         "diratime", "nodiratime", "iversion", "noiversion", "mand", "nomand", "silent", "loud"})
# `cowfs mount` flags that mean nothing as a mount option.
REFUSED = {
    "foreground": "mount(8) would wait until the unmount; run `cowfs mount --foreground` instead",
    "help": "see `mount.cowfs --help`",
}
READ_ONLY = ("cowfs has no read-only mount yet: mount read-write (snapshots under "
             "MOUNTPOINT/.snapshots are read-only)")


class UsageError(InvalidArgument):
    """A bad helper argument or mount option: exit 1, nothing mounted."""


@dataclass(frozen=True)
class MountFlag:
    flag: str  # the `cowfs mount` option string, e.g. --auto-snapshot
    takes_value: bool
    metavar: str
    help: str


@dataclass
class Translation:
    argv: list[str] = field(default_factory=list)  # `cowfs mount` flags
    vfs_options: list[str] = field(default_factory=list)  # for the FUSE mount itself
    ignored: list[str] = field(default_factory=list)


def option_name(flag: str) -> str:
    """--auto-snapshot -> auto_snapshot (mount options use underscores, like FUSE's own)."""
    return flag.removeprefix("--").replace("-", "_")


def mount_parser() -> argparse.ArgumentParser:
    """The argparse parser of `cowfs mount` (a subparser of cli.build_parser())."""
    from .cli import build_parser

    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices["mount"]
    raise RuntimeError("cowfs has no mount command")


def mount_flags(parser: argparse.ArgumentParser) -> dict[str, MountFlag]:
    """Mount option name -> `cowfs mount` flag, for every long option of `parser`.
    A --no-X option (BooleanOptionalAction) is also spelled noX, like FUSE's nofoo options."""
    flags: dict[str, MountFlag] = {}
    for action in parser._actions:
        help_text = action.help if action.help and action.help != argparse.SUPPRESS else ""
        metavar = action.metavar if isinstance(action.metavar, str) else action.dest.upper()
        for flag in action.option_strings:
            if not flag.startswith("--"):
                continue
            name = option_name(flag)
            spec = MountFlag(flag, action.nargs != 0, metavar, help_text)
            flags[name] = spec
            if name.startswith("no_"):
                flags["no" + name[3:]] = spec
    return flags


def split_options(text: str) -> list[str]:
    """'a,b=1,c="x,y"' -> ['a', 'b=1', 'c=x,y']: libmount's syntax (a quoted value may hold commas)."""
    out: list[str] = []
    part, quoted = "", False
    for ch in text:
        if ch == '"':
            quoted = not quoted
        elif ch == "," and not quoted:
            out.append(part)
            part = ""
        else:
            part += ch
    if quoted:
        raise UsageError(f"unbalanced quote in mount options: {text}")
    out.append(part)
    return [o for o in out if o]


def translate(options: Sequence[str], flags: dict[str, MountFlag], sloppy: bool = False,
              warn: Callable[[str], None] = lambda msg: None) -> Translation:
    """Mount options -> `cowfs mount` flags and FUSE mount flags. An unknown option is a
    UsageError naming it (with `sloppy`, mount -s: a warning, and it is left out)."""
    t = Translation()
    for option in options:
        key, eq, value = option.partition("=")
        name = key.replace("-", "_")
        if option in USERSPACE or option.startswith(USERSPACE_PREFIXES) or option in VFS_IGNORED:
            t.ignored.append(option)
        elif option in VFS_PASSED:
            t.vfs_options.append(option)
        elif option == "ro":
            raise UsageError(f"ro: {READ_ONLY}")
        elif name in REFUSED:
            raise UsageError(f"{option}: {REFUSED[name]}")
        elif name in flags:
            spec = flags[name]
            if spec.takes_value and not eq:
                raise UsageError(f"{option}: needs a value ({name}=...)")
            if not spec.takes_value and eq:
                raise UsageError(f"{option}: {name} takes no value")
            t.argv.append(f"{spec.flag}={value}" if spec.takes_value else spec.flag)
        elif sloppy:
            warn(f"ignoring unknown mount option {option} (-s)")
            t.ignored.append(option)
        else:
            raise UsageError(f"unknown mount option {option} (see `mount.cowfs --help`)")
    return t


def parse_mount_args(parser: argparse.ArgumentParser, store: str, mountpoint: str,
                     argv: Sequence[str]) -> argparse.Namespace:
    """Parse `cowfs mount STORE MOUNTPOINT ARGV...` with `parser`; its errors raise UsageError."""
    def error(message: str) -> NoReturn:  # "argument --workers: ..." -> "workers: ..."
        raise UsageError(re.sub(r"argument (--[\w-]+)(/--[\w-]+)*", lambda m: option_name(m.group(1)), message))

    parser.error = error  # type: ignore[method-assign]
    return parser.parse_args([*argv, "--", store, mountpoint])


@dataclass
class HelperCall:
    store: str
    mountpoint: str
    options: list[str]
    sloppy: bool
    fake: bool
    verbose: bool


def parse_helper_args(argv: Sequence[str]) -> HelperCall:
    """mount(8)'s helper convention: STORE MOUNTPOINT [-s] [-f] [-n] [-v] [-o OPTIONS]... [-t TYPE]."""
    def error(message: str) -> NoReturn:
        raise UsageError(f"{message} (usage: {PROG} STORE MOUNTPOINT [-o OPTIONS]; see --help)")

    p = argparse.ArgumentParser(prog=PROG, add_help=False)
    p.error = error  # type: ignore[method-assign]
    p.add_argument("store")
    p.add_argument("mountpoint")
    p.add_argument("-o", dest="options", action="append", default=[])
    p.add_argument("-s", dest="sloppy", action="store_true")
    p.add_argument("-f", dest="fake", action="store_true")
    p.add_argument("-n", dest="no_mtab", action="store_true")  # no /etc/mtab to write: nothing to do
    p.add_argument("-v", dest="verbose", action="store_true")
    p.add_argument("-t", dest="type")
    p.add_argument("-N", dest="namespace")
    a = p.parse_args(argv)
    if a.namespace is not None:
        raise UsageError("-N (mount in another namespace) is not supported: run mount inside that namespace")
    if a.type is not None and a.type not in ("fuse.cowfs", "cowfs"):
        raise UsageError(f"-t {a.type}: this helper mounts type fuse.cowfs")
    options = [o for text in a.options for o in split_options(text)]
    return HelperCall(a.store, a.mountpoint, options, a.sloppy, a.fake, a.verbose)


def usage() -> str:
    lines = [
        f"usage: {PROG} STORE MOUNTPOINT [-o OPTION[,OPTION...]] [-s] [-f] [-n] [-v]",
        f"       {PROG} --install | --uninstall",
        "",
        "Run by mount(8) as /sbin/mount.fuse.cowfs for `mount -t fuse.cowfs STORE MOUNTPOINT -o OPTIONS`",
        "and /etc/fstab lines of type fuse.cowfs; returns once the mount is live.",
        "",
        "cowfs options (the flags of `cowfs mount`):",
    ]
    by_flag: dict[MountFlag, list[str]] = {}
    for name, spec in mount_flags(mount_parser()).items():
        if name not in REFUSED:
            by_flag.setdefault(MountFlag("", spec.takes_value, spec.metavar, spec.help), []).append(name)
    for spec, names in by_flag.items():
        shown = " | ".join(n + (f"={spec.metavar}" if spec.takes_value else "") for n in names)
        lines.append(f"  {shown}\n      {spec.help}")
    lines += [
        "",
        f"passed to the FUSE mount: {', '.join(sorted(VFS_PASSED))}",
        f"accepted and ignored: {', '.join(sorted(USERSPACE | VFS_IGNORED))}, x-*, comment=..., user=...",
        f"ro: {READ_ONLY}",
        "-s: warn about unknown options and leave them out; -f: check the options, mount nothing;",
        "-v: print the `cowfs mount` command; -n: accepted (no /etc/mtab to write).",
        "exit codes: 0 mounted, 1 bad arguments or options, 32 mount failed (the store, the",
        "mountpoint or the daemon: one line on stderr, as from `cowfs mount`).",
    ]
    return "\n".join(lines)


def _error_line(e: BaseException) -> str:
    if isinstance(e, OSError) and not isinstance(e, CowfsError):
        return f"{e.filename or ''}{': ' if e.filename else ''}{e.strerror or e}"
    return str(e)


def run(argv: Sequence[str]) -> int:
    try:
        call = parse_helper_args(argv)
        parser = mount_parser()
        t = translate(call.options, mount_flags(parser), call.sloppy,
                      warn=lambda msg: print(f"{PROG}: {msg}", file=sys.stderr))
        args = parse_mount_args(parser, call.store, call.mountpoint, t.argv)
    except UsageError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return EX_USAGE
    if call.verbose:
        extra = f" (FUSE mount options: {','.join(t.vfs_options)})" if t.vfs_options else ""
        print(f"{PROG}: cowfs mount {shlex.join([*t.argv, call.store, call.mountpoint])}{extra}")
    if call.fake:
        return 0
    args.vfs_options = t.vfs_options  # cmd_mount hands them to the FUSE mount
    try:
        # a helper is quiet on success: cowfs mount's "mounted ..." line only with -v
        with contextlib.redirect_stdout(sys.stdout if call.verbose else io.StringIO()):
            code = int(args.fn(args))
    except (CowfsError, OSError) as e:
        print(f"{PROG}: {_error_line(e)}", file=sys.stderr)
        return EX_FAIL
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return EX_INTERRUPTED
    return 0 if code == 0 else EX_FAIL


def script_path() -> Path:
    """This environment's mount.cowfs script (where pip puts console scripts), symlinks
    in its directory resolved, so the link does not depend on how the venv was reached."""
    return Path(os.path.realpath(sysconfig.get_path("scripts"))) / SCRIPT_NAME


def install(link: Path, script: Path) -> str:
    """Make `link` a symlink to `script`. Running it again changes nothing; a dangling link to
    a mount.cowfs (a removed checkout's) is replaced; anything else at `link` is left as it is."""
    if not script.is_file():
        raise CowfsError(f"{script} does not exist: install the package first (make setup)")
    try:
        current = os.readlink(link)
    except FileNotFoundError:
        os.symlink(script, link)
        return f"installed {link} -> {script}"
    except OSError:  # EINVAL: not a symlink
        raise CowfsError(f"{link} exists and is not a symlink: left as it is") from None
    if os.path.realpath(link) == os.path.realpath(script):
        return f"{link} -> {current} already"
    if Path(current).name == SCRIPT_NAME and not link.exists():
        tmp = link.with_name(f".{link.name}.{os.getpid()}")
        os.symlink(script, tmp)
        os.replace(tmp, link)
        return f"replaced {link} -> {current} (gone) with {link} -> {script}"
    raise CowfsError(f"{link} points to {current}, not {script}: left as it is (remove it to install this one)")


def uninstall(link: Path, script: Path) -> str:
    """Remove `link` if it is a symlink to `script`; leave anything else."""
    if not os.path.lexists(link):
        return f"{link} is not there"
    if not link.is_symlink() or os.path.realpath(link) != os.path.realpath(script):
        raise CowfsError(f"{link} is not a link to {script}: left as it is")
    link.unlink()
    return f"removed {link}"


def install_main(argv: Sequence[str]) -> int:
    def error(message: str) -> NoReturn:
        raise UsageError(f"{message} (usage: {PROG} {argv[0]} [--link PATH] [--script PATH])")

    p = argparse.ArgumentParser(prog=f"{PROG} {argv[0]}")
    p.error = error  # type: ignore[method-assign]
    p.add_argument("--link", type=Path, default=HELPER_LINK, help=f"default {HELPER_LINK}")
    p.add_argument("--script", type=Path, default=script_path(), help="default: this environment's mount.cowfs")
    try:
        args = p.parse_args(argv[1:])
        if os.geteuid() != 0:
            raise CowfsError(f"only root can {argv[0][2:]} {args.link}")
        action = install if argv[0] == "--install" else uninstall
        print(f"{PROG}: {action(args.link, args.script.absolute())}")
    except (CowfsError, OSError) as e:
        print(f"{PROG}: {_error_line(e)}", file=sys.stderr)
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["--install"], ["--uninstall"]):
        return install_main(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(), file=sys.stdout if argv else sys.stderr)
        return 0 if argv else EX_USAGE
    return run(argv)


if __name__ == "__main__":
    sys.exit(main())
