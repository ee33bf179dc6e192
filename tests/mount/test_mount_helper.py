"""mount.cowfs, the helper mount(8) runs for type fuse.cowfs: its option translation (no mount),
its install step, and real mounts through it and through mount(8), unmounted by plain umount(8)."""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

import pytest

import cowfs
from cowfs.cli import build_parser, main as cli_main
from cowfs.errors import CowfsError
from cowfs.mount_helper import (HELPER_LINK, EX_FAIL, EX_USAGE, UsageError, install, main, mount_flags, mount_parser,
                                parse_helper_args, parse_mount_args, split_options, translate, uninstall)
from cowfs.mountinfo import mounted_cowfs, process_alive

from tests.support.mountutil import cowfs as cowfs_cli, daemon_pid, force_unmount

REPO = Path(cowfs.__file__).resolve().parents[1]
# mount(8) runs whichever venv's script /sbin/mount.fuse.cowfs links to: PYTHONPATH makes it
# (and the helper run with -m) import this checkout's cowfs
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
needs_helper = pytest.mark.skipif(not HELPER_LINK.exists(),
                                  reason=f"{HELPER_LINK} is not installed (make setup as root links it)")


def run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, env=ENV, cwd=REPO, stdin=subprocess.DEVNULL, timeout=120)


def helper(*args: str) -> subprocess.CompletedProcess[str]:
    return run(sys.executable, "-m", "cowfs.mount_helper", *args)


def wait_for(condition: Callable[[], bool], seconds: float = 30) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


class Mounts:
    """Records the daemons the test starts; `cleanup` unmounts and stops them however it ends."""

    def __init__(self, store: Path) -> None:
        self.store = store
        self.pids: list[int] = []

    def live(self, r: subprocess.CompletedProcess[str], mnt: Path) -> None:
        assert r.returncode == 0, r.stderr
        assert mounted_cowfs().get(str(mnt)) == str(self.store)
        self.pids.append(daemon_pid(self.store))

    def umount(self, mnt: Path) -> None:
        """Plain umount(8), then the daemon finishes by itself: waits for it, checks the store."""
        r = run("umount", str(mnt))
        assert r.returncode == 0, r.stderr
        assert wait_for(lambda: not process_alive(self.pids[-1])), "the daemon did not exit after umount"
        assert_released(self.store, mnt)


@contextlib.contextmanager
def cleanup(store: Path, *mnts: Path) -> Iterator[Mounts]:
    for m in mnts:
        m.mkdir(exist_ok=True)
    mounts = Mounts(store)
    try:
        yield mounts
    finally:
        holder = (store / "lock").read_text().strip()  # a daemon the test did not get to record
        if holder.isdigit():
            mounts.pids.append(int(holder))
        for m in mnts:
            if str(m) in mounted_cowfs() and run("umount", str(m)).returncode != 0:
                force_unmount(m)
        for pid in mounts.pids:
            if not wait_for(lambda: not process_alive(pid)):
                os.kill(pid, signal.SIGKILL)
                for m in mnts:
                    force_unmount(m)


def assert_released(store: Path, mnt: Path) -> None:
    """Not mounted, no daemon socket, no pid in the lock file, and the lock is free."""
    assert str(mnt) not in mounted_cowfs() and not (store / "daemon.sock").exists()
    assert (store / "lock").read_text() == ""
    fd = os.open(store / "lock", os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)


def mount_line(mnt: Path) -> str:
    with open("/proc/self/mountinfo") as f:
        return next(line for line in f if line.split()[4] == str(mnt))


# ---- option translation (no mount) ----

def test_cowfs_options_become_cowfs_mount_flags() -> None:
    flags = mount_flags(mount_parser())
    t = translate(["auto_snapshot=10m", "allow_other", "compact_idle=off", "workers=4", "writeback_cache", "debug"], flags)
    assert t.argv == ["--auto-snapshot=10m", "--allow-other", "--compact-idle=off", "--workers=4", "--writeback-cache", "--debug"]
    for spelling in ("nowriteback_cache", "no_writeback_cache", "no-writeback-cache"):
        assert translate([spelling], flags).argv == ["--no-writeback-cache"]
    assert translate(["auto-snapshot=1h"], flags).argv == ["--auto-snapshot=1h"]
    # the same Namespace `cowfs mount` itself gets for those flags
    ours = parse_mount_args(mount_parser(), "S", "M", t.argv)
    theirs = build_parser().parse_args(["mount", "S", "M", "--auto-snapshot", "10m", "--allow-other", "--compact-idle",
                                        "off", "--workers", "4", "--writeback-cache", "--debug"])
    assert vars(ours) == {k: v for k, v in vars(theirs).items() if k != "command"}


def test_every_cowfs_mount_flag_is_an_option() -> None:
    parser = mount_parser()
    flags = mount_flags(parser)
    for action in parser._actions:
        for flag in (f for f in action.option_strings if f.startswith("--") and f not in ("--help", "--foreground")):
            name = flag[2:].replace("-", "_")
            assert flags[name].flag == flag
            value = action.choices[0] if action.choices else "2" if action.type is int else "1h"
            option = f"{name}={value}" if flags[name].takes_value else name
            args = parse_mount_args(mount_parser(), "S", "M", translate([option], flags).argv)
            assert getattr(args, action.dest) not in (action.default, None), flag


def test_a_flag_cowfs_mount_grows_is_an_option_at_once() -> None:
    parser = mount_parser()  # as when `cowfs mount` gets these flags
    parser.add_argument("--upload-on", choices=["close", "snapshot"])
    parser.add_argument("--fsync-dirs", action=argparse.BooleanOptionalAction, default=True)
    t = translate(["upload_on=snapshot", "nofsync_dirs", "snapshot_on=checkpoint"], mount_flags(parser))
    args = parse_mount_args(parser, "S", "M", t.argv)
    assert (args.upload_on, args.fsync_dirs, args.snapshot_on) == ("snapshot", False, "checkpoint")
    with pytest.raises(UsageError, match="^upload_on: invalid choice: 'never'"):
        parse_mount_args(parser, "S", "M", translate(["upload_on=never"], mount_flags(parser)).argv)


def test_generic_mount_options_are_passed_on_or_ignored() -> None:
    passed = ["rw", "nosuid", "nodev", "noexec", "noatime", "suid", "dev", "exec", "atime", "sync", "async", "dirsync"]
    ignored = ["defaults", "auto", "noauto", "nofail", "_netdev", "user", "users", "nouser", "owner", "group",
               "x-systemd.automount", "x-systemd.requires=/data", "comment=cowfs", "user=alice", "relatime",
               "nodiratime", "lazytime", "strictatime"]
    t = translate(passed + ignored, mount_flags(mount_parser()))
    assert (t.argv, t.vfs_options, t.ignored) == ([], passed, ignored)


@pytest.mark.parametrize("option, message", [
    ("ro", "ro: cowfs has no read-only mount yet"),
    ("bogus", "unknown mount option bogus"),
    ("fsname=x", "unknown mount option fsname=x"),
    ("allow_other=yes", "allow_other=yes: allow_other takes no value"),
    ("auto_snapshot", "auto_snapshot: needs a value"),
    ("foreground", "foreground: mount(8) would wait until the unmount"),
])
def test_bad_options_are_one_line_usage_errors(option: str, message: str) -> None:
    with pytest.raises(UsageError) as e:
        translate(["allow_other", option], mount_flags(mount_parser()))
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_sloppy_leaves_unknown_options_out_with_a_warning() -> None:
    warnings: list[str] = []
    t = translate(["bogus", "debug"], mount_flags(mount_parser()), sloppy=True, warn=warnings.append)
    assert t.argv == ["--debug"] and warnings == ["ignoring unknown mount option bogus (-s)"]
    with pytest.raises(UsageError):  # -s tolerates unknown options, not a read-only mount
        translate(["ro"], mount_flags(mount_parser()), sloppy=True)


def test_option_strings_and_helper_arguments() -> None:
    assert split_options('a,b=1,,c="x,y"') == ["a", "b=1", "c=x,y"]
    with pytest.raises(UsageError, match="unbalanced quote"):
        split_options('a="x')
    call = parse_helper_args(["/s", "/m", "-s", "-f", "-n", "-v", "-o", "a,b", "-o", "c", "-t", "fuse.cowfs"])
    assert (call.store, call.mountpoint, call.options, call.sloppy, call.fake, call.verbose) == \
        ("/s", "/m", ["a", "b", "c"], True, True, True)
    for argv, message in ((["/s"], "required: mountpoint"), (["/s", "/m", "-N", "/proc/1/ns/mnt"], "-N"),
                          (["/s", "/m", "-t", "ext4"], "-t ext4")):
        with pytest.raises(UsageError, match=message):
            parse_helper_args(argv)


def test_main_exit_codes_and_fake_mount(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "m").mkdir()
    assert main([str(tmp_path / "s"), str(tmp_path / "m"), "-f", "-o", "auto_snapshot=10m,nofail"]) == 0
    assert str(tmp_path / "m") not in mounted_cowfs() and capsys.readouterr() == ("", "")
    assert main([str(tmp_path / "s"), str(tmp_path / "m"), "-f", "-v", "-o", "workers=2,noexec"]) == 0
    assert capsys.readouterr().out == (f"mount.cowfs: cowfs mount --workers=2 {tmp_path}/s {tmp_path}/m "
                                       "(FUSE mount options: noexec)\n")
    for argv, code, message in (([str(tmp_path / "s"), str(tmp_path / "m"), "-o", "bogus"], EX_USAGE, "bogus"),
                                ([str(tmp_path / "s"), str(tmp_path / "m"), "-o", "workers=many"], EX_USAGE, "workers"),
                                ([str(tmp_path / "s"), str(tmp_path / "m")], EX_FAIL, "no such directory|/dev/fuse"),
                                ([], EX_USAGE, "usage: mount.cowfs")):
        assert main(argv) == code
        err = capsys.readouterr().err
        assert re.search(message, err) and (err.count("\n") == 1 or not argv), err
    assert main(["--help"]) == 0 and "auto_snapshot=DURATION" in capsys.readouterr().out


def test_install_links_once_and_never_replaces_another_file(tmp_path: Path) -> None:
    script = tmp_path / "venv" / "mount.cowfs"
    script.parent.mkdir()
    script.write_text("#!/bin/sh\n")
    link = tmp_path / "mount.fuse.cowfs"
    assert install(link, script) == f"installed {link} -> {script}"
    assert install(link, script).endswith("already") and os.readlink(link) == str(script)
    link.unlink()
    link.symlink_to(tmp_path / "gone-checkout" / "mount.cowfs")  # a removed checkout's link: replaced
    assert install(link, script).startswith("replaced") and os.readlink(link) == str(script)
    other = tmp_path / "other"
    other.write_text("theirs")
    link.unlink()
    link.symlink_to(other)
    with pytest.raises(CowfsError, match="left as it is"):
        install(link, script)
    with pytest.raises(CowfsError, match="left as it is"):
        uninstall(link, script)
    assert os.readlink(link) == str(other)
    link.unlink()
    link.write_text("an admin's own helper")
    with pytest.raises(CowfsError, match="not a symlink"):
        install(link, script)
    assert link.read_text() == "an admin's own helper"
    link.unlink()
    with pytest.raises(CowfsError, match="does not exist"):
        install(link, tmp_path / "missing" / "mount.cowfs")
    assert not os.path.lexists(link)
    install(link, script)
    assert uninstall(link, script) == f"removed {link}" and not os.path.lexists(link)


# ---- real mounts ----

@pytest.mark.mount
@pytest.mark.parametrize("cache", ["nowriteback_cache", "writeback_cache"])
def test_helper_mounts_and_plain_umount_leaves_a_clean_store(store_path: Path, tmp_path: Path, cache: str) -> None:
    mnt = tmp_path / "mnt"
    files = {f"/run/ckpt-{i}.pt": os.urandom(1 << (12 + 2 * i)) for i in range(5)}  # 4 KiB .. 1 MiB
    with cleanup(store_path, mnt) as mounts:
        r = helper(str(store_path), str(mnt), "-o", f"auto_snapshot=1s,allow_other,compact_idle=off,{cache},noatime,"
                   "nofail,_netdev,x-systemd.automount,comment=test,rw")
        mounts.live(r, mnt)
        assert r.stdout == "" and r.stderr == ""  # a helper is quiet on success
        line = mount_line(mnt)
        assert "noatime" in line.split(" - ")[0] and "allow_other" in line.split(" - ")[1]
        (mnt / "run").mkdir()
        (mnt / "run" / "ckpt-0.pt").write_bytes(files["/run/ckpt-0.pt"])
        assert wait_for(lambda: os.listdir(mnt / ".snapshots") != [])  # auto_snapshot=1s took one
        for path, data in files.items():  # the last close is right before the umount
            with open(mnt / path[1:], "wb") as f:
                f.write(data)
        mounts.umount(mnt)  # plain umount(8): the daemon finishes, releases the lock, exits

        mounts.live(helper(str(store_path), str(mnt)), mnt)
        for path, data in files.items():
            assert (mnt / path[1:]).read_bytes() == data, path
        (mnt / "after").write_bytes(b"second mount")
        r = run("umount", str(mnt))  # `umount X && mount X` in a script: no wait in between
        assert r.returncode == 0, r.stderr
        mounts.live(helper(str(store_path), str(mnt)), mnt)
        assert (mnt / "after").read_bytes() == b"second mount"
        mounts.umount(mnt)
    assert cowfs_cli("fsck", str(store_path)).returncode == 0


@pytest.mark.mount
def test_helper_errors_are_those_of_cowfs_mount(store_path: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """In this process: each of these fails before `cowfs mount` forks."""
    full, m1, m2 = tmp_path / "full", tmp_path / "m1", tmp_path / "m2"
    full.mkdir()
    (full / "x").write_text("x")

    def both(store: str, mnt: Path) -> tuple[str, str]:
        assert main([store, str(mnt), "-o", "allow_other"]) == EX_FAIL
        ours = capsys.readouterr().err
        assert cli_main(["mount", store, str(mnt), "--allow-other"]) == 2
        return ours, capsys.readouterr().err

    with cleanup(store_path, m1, m2) as mounts:
        for store, mnt in ((str(tmp_path / "nostore"), m1), (str(store_path), tmp_path / "missing"), (str(store_path), full)):
            ours, theirs = both(store, mnt)
            assert ours == "mount.cowfs: " + theirs.removeprefix("cowfs: ") and ours.count("\n") == 1
        mounts.live(helper(str(store_path), str(m1)), m1)
        ours, theirs = both(str(store_path), m2)  # the store is mounted already
        assert ours == "mount.cowfs: " + theirs.removeprefix("cowfs: ") and "already mounted" in ours
        ours, theirs = both(str(store_path), m1)  # so is the mountpoint
        assert ours == "mount.cowfs: " + theirs.removeprefix("cowfs: ") and "already mounted there" in ours
        for option, code, message in (("ro", EX_USAGE, "no read-only mount"), ("workers=x", EX_USAGE, "workers"),
                                      ("auto_snapshot=0s", EX_FAIL, "not a duration")):  # cowfs mount's own check
            assert main([str(store_path), str(m2), "-o", option]) == code
            err = capsys.readouterr().err
            assert message in err and err.count("\n") == 1, err
        assert str(m2) not in mounted_cowfs() and mounted_cowfs()[str(m1)] == str(store_path)
        mounts.umount(m1)


@pytest.mark.mount
@needs_helper
def test_mount8_and_an_fstab_line(store_path: Path, tmp_path: Path) -> None:
    mnt = tmp_path / "mnt"
    fstab = tmp_path / "fstab"
    fstab.write_text(f"# cowfs\n{store_path} {mnt} fuse.cowfs allow_other,auto_snapshot=10m,nofail,noauto,"
                     "x-systemd.requires=local-fs.target,comment=ckpt 0 0\n")
    data = os.urandom(3 << 20)
    with cleanup(store_path, mnt) as mounts:
        r = run("mount", "-t", "fuse.cowfs", str(store_path), str(mnt), "-o", "auto_snapshot=10m,compact_idle=off")
        mounts.live(r, mnt)
        (mnt / "model.pt").write_bytes(data)
        mounts.umount(mnt)

        mounts.live(run("mount", "--fstab", str(fstab), str(mnt)), mnt)
        assert "allow_other" in mount_line(mnt).split(" - ")[1]
        assert (mnt / "model.pt").read_bytes() == data
        (mnt / "model.pt").write_bytes(data[::-1])
        mounts.umount(mnt)

        r = run("mount", "--fake", "-t", "fuse.cowfs", str(store_path), str(mnt), "-o", "auto_snapshot=10m")
        assert r.returncode == 0 and str(mnt) not in mounted_cowfs()
        r = run("mount", "-t", "fuse.cowfs", str(store_path), str(mnt), "-o", "bogus_option")
        assert r.returncode == EX_USAGE and "unknown mount option bogus_option" in r.stderr
        r = run("mount", "-r", "-t", "fuse.cowfs", str(store_path), str(mnt))
        assert r.returncode == EX_USAGE and "read-only" in r.stderr
        assert str(mnt) not in mounted_cowfs()
        mounts.live(run("mount", "--fstab", str(fstab), str(mnt)), mnt)
        assert (mnt / "model.pt").read_bytes() == data[::-1]
        mounts.umount(mnt)
