"""Bad input to every CLI command (issue 5): a wrong path, a file, an empty or garbage
directory, a damaged or newer-format store, a store the user may not read or write,
unknown and invalid snapshot names, a store mounted twice, umount of what is not mounted.

Every case must exit 2 with exactly one line on stderr ("cowfs: ..." naming the problem),
nothing on stdout, no traceback, and leave the store exactly as it was: every file and
directory under it (names, kinds, modes, owners, sizes, sha256 of the contents) is
compared before and after. diff and watch have their own cases in their tests."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterator

import pytest

from cowfs.store.log.layout import CONFIG_FILE, FORMAT_VERSION
from cowfs.store.log.records import decode_segment_header, encode_segment_header
from tests.support.mountutil import mounted
from tests.support.run_as_nobody import NOBODY_UID, NOGROUP_GID, cowfs_command_as_nobody
from tests.support.storeutil import assert_clean, data, store_with_history

# contents that change on their own while a store is mounted and idle: the shared-memory
# index of SQLite's WAL (readers take read marks in it); its name, size and mode still count
VOLATILE = {"catalog.db-shm"}


def cli(*args: str, as_nobody: bool = False) -> subprocess.CompletedProcess:
    """`cowfs ARGS` as root, or as nobody wherever the checkout lives (tests/support/run_as_nobody.py)."""
    cmd = cowfs_command_as_nobody(*args) if as_nobody else [sys.executable, "-m", "cowfs.cli", *args]
    return subprocess.run(cmd, capture_output=True, timeout=120, stdin=subprocess.DEVNULL, cwd="/")


def fingerprint(top: Path) -> dict[str, tuple]:
    """Everything under `top` (and `top` itself) that a command could change."""
    if not os.path.lexists(top):
        return {}
    out: dict[str, tuple] = {}
    paths = [top] + sorted(top.rglob("*")) if top.is_dir() and not top.is_symlink() else [top]
    for p in paths:
        st = p.lstat()
        meta = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid)
        rel = str(p.relative_to(top)) if p != top else "."
        if stat.S_ISREG(st.st_mode):
            digest = None if p.name in VOLATILE else hashlib.sha256(p.read_bytes()).hexdigest()
            out[rel] = (*meta, st.st_size, digest)
        elif stat.S_ISLNK(st.st_mode):
            out[rel] = (*meta, os.readlink(p))
        else:
            out[rel] = meta
    return out


def case_id(args: tuple[str, ...]) -> str:
    """A readable test id: the arguments without placeholders, long ones shortened."""
    words = {"{S}": "STORE", "{M}": "MNT"}
    shown = [words.get(a, a) if len(a) <= 20 else f"{a[0]}*{len(a)}" for a in args if a != "{T}"]
    return " ".join(repr(a) if a == "" else a for a in shown)


def assert_rejected(r: subprocess.CompletedProcess, expect: str, code: int = 2) -> None:
    """Exit 2 (1: fsck found damage), exactly one line on stderr that names the problem,
    nothing on stdout."""
    err = r.stderr.decode(errors="replace")
    what = f"exit {r.returncode}, stdout {r.stdout[:200]!r}, stderr {err!r}"
    assert r.returncode == code, what
    assert "Traceback" not in err, what
    assert err.startswith("cowfs: ") and err.endswith("\n") and err.count("\n") == 1, what
    assert expect in err, f"{expect!r} not in the message: {what}"
    assert r.stdout == b"", what


def make_store(path: Path) -> Path:
    """A small store with one file, one snapshot and a later version of the file."""
    return store_with_history(path, 300_000)


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The good store the cases copy; unchanged by the cases, so fsck'ed once, at the end."""
    store = make_store(tmp_path_factory.mktemp("template") / "store")
    yield store
    assert_clean(store)


def let_nobody_in(path: Path) -> None:
    """Let the unprivileged user reach `path`: search permission on every directory from
    the root down to it. pytest makes its directories 0700, also /tmp/pytest-of-root above
    the base temp directory when no --basetemp is given (as in CI); pytest sets that one
    back to 0700 at its next start."""
    for d in [path, *path.parents]:
        if d.is_dir() and d.stat().st_mode & 0o001 == 0:
            d.chmod(d.stat().st_mode | 0o111)


# -- damaged, foreign and forbidden stores: one builder per condition ------------------------
# Each builds the condition at `p` (from a copy of a good store where it needs one) and
# returns whether the command runs as the unprivileged user, and the message expected.

def _copy(template: Path, p: Path) -> None:
    shutil.copytree(template, p, symlinks=True)


def _config(p: Path) -> dict:
    return json.loads((p / CONFIG_FILE).read_text())


def missing(template: Path, p: Path) -> tuple[bool, str]:
    return False, "no such directory"


def a_file(template: Path, p: Path) -> tuple[bool, str]:
    p.write_bytes(b"not a store\n")
    return False, "not a cowfs store"


def empty_dir(template: Path, p: Path) -> tuple[bool, str]:
    p.mkdir()
    return False, "not a cowfs store"


def random_files(template: Path, p: Path) -> tuple[bool, str]:
    p.mkdir()
    (p / "segments").mkdir()
    (p / "catalog.db").write_bytes(os.urandom(8192))
    (p / "notes.txt").write_bytes(os.urandom(100))
    return False, "not a cowfs store"


def garbage_config(template: Path, p: Path) -> tuple[bool, str]:
    _copy(template, p)
    (p / CONFIG_FILE).write_bytes(b'{"format": "cowfs-store", "format_version": 1,' + os.urandom(64))
    return False, "unreadable store config"


def config_missing_keys(template: Path, p: Path) -> tuple[bool, str]:
    _copy(template, p)
    cfg = _config(p)
    del cfg["segment_size"], cfg["store_uuid"]
    (p / CONFIG_FILE).write_text(json.dumps(cfg))
    return False, "missing a field"


def config_of_something_else(template: Path, p: Path) -> tuple[bool, str]:
    _copy(template, p)
    (p / CONFIG_FILE).write_text(json.dumps(["cowfs-store", 1]))
    return False, "not a cowfs store config"


def newer_format(template: Path, p: Path) -> tuple[bool, str]:
    _copy(template, p)
    cfg = _config(p)
    cfg["format_version"] = FORMAT_VERSION + 1
    (p / CONFIG_FILE).write_text(json.dumps(cfg))
    return False, f"format version {FORMAT_VERSION + 1} is not supported"


def garbage_catalog(template: Path, p: Path) -> tuple[bool, str]:
    _copy(template, p)
    (p / "catalog.db").write_bytes(os.urandom((p / "catalog.db").stat().st_size))
    return False, "catalog"


def no_catalog(template: Path, p: Path) -> tuple[bool, str]:
    _copy(template, p)
    (p / "catalog.db").unlink()
    return False, "catalog catalog.db is missing"


def no_segments_dir(template: Path, p: Path) -> tuple[bool, str]:
    _copy(template, p)
    shutil.rmtree(p / "segments")
    return False, "no segments/ directory"


def unreadable(template: Path, p: Path) -> tuple[bool, str]:
    """root's store, mode 0700: the unprivileged user may not even read its config."""
    _copy(template, p)
    p.chmod(0o700)
    return True, "Permission denied"


def read_only(template: Path, p: Path) -> tuple[bool, str]:
    """root's store, readable by all: the unprivileged user may read but not write it."""
    _copy(template, p)
    return True, "Permission denied"


def catalog_read_only(template: Path, p: Path) -> tuple[bool, str]:
    """The user's store, except the catalog: root's and read-only to the user."""
    _copy(template, p)
    for q in [p, *p.rglob("*")]:
        os.chown(q, NOBODY_UID, NOGROUP_GID)
    os.chown(p / "catalog.db", 0, 0)
    (p / "catalog.db").chmod(0o644)
    return True, "permission denied"


def segment_of_another_store(template: Path, p: Path) -> tuple[bool, str]:
    """One segment file's header names another store (moved in from it)."""
    _copy(template, p)
    seg = sorted((p / "segments").glob("*.seg"))[0]
    with open(seg, "r+b") as f:
        old = decode_segment_header(f.read(64))
        f.seek(0)
        f.write(encode_segment_header(old.seg_id, str(uuid.uuid4()), old.created_ns, old.version))
    return False, "a segment of store"


def catalog_of_another_store(template: Path, p: Path) -> tuple[bool, str]:
    _copy(template, p)
    with sqlite3.connect(p / "catalog.db") as conn:
        conn.execute("UPDATE meta SET value=? WHERE key='store_uuid'", (str(uuid.uuid4()),))
    conn.close()
    return False, "is the catalog of store"


CONDITIONS: list[Callable[[Path, Path], tuple[bool, str]]] = [
    missing, a_file, empty_dir, random_files, garbage_config, config_missing_keys, config_of_something_else,
    newer_format, garbage_catalog, no_catalog, no_segments_dir, unreadable, read_only, catalog_read_only,
    segment_of_another_store, catalog_of_another_store,
]

# {T}: the bad store (as TARGET, STORE or MOUNTPOINT); {M}: an empty directory to mount on
COMMANDS: dict[str, tuple[str, ...]] = {
    "stats": ("stats", "{T}"),
    "snapshot-create": ("snapshot", "create", "{T}", "new"),
    "snapshot-list": ("snapshot", "list", "{T}"),
    "snapshot-delete": ("snapshot", "delete", "{T}", "one"),
    "gc": ("gc", "{T}"),
    "log": ("log", "{T}", "/run/model.pt"),
    "cat": ("cat", "{T}", "/run/model.pt"),
    "ls": ("ls", "{T}", "/run"),
    "restore": ("restore", "{T}", "/run/model.pt", "--snapshot", "one"),
    "prune": ("prune", "{T}", "--keep-last", "1"),
    "fsck": ("fsck", "{T}"),
    "mount": ("mount", "{T}", "{M}"),
    "umount": ("umount", "{T}"),
    "remote-status": ("remote", "status", "{T}"),
    "remote-push": ("remote", "push", "{T}"),
    "remote-gc": ("remote", "gc", "{T}"),
    "remote-fsck": ("remote", "fsck", "{T}"),
}


def expected_for(command: str, condition: str, message: str) -> str:
    if command == "umount":  # it takes a mountpoint: none of these is one
        return "no such directory" if condition == "missing" else "no cowfs filesystem is mounted there"
    return message


def check_rejected(r: subprocess.CompletedProcess, expect: str, code: int = 2) -> str | None:
    """What is wrong with how a command refused, or None."""
    try:
        assert_rejected(r, expect, code)
    except AssertionError as e:
        return str(e).splitlines()[0]
    return None


def run_condition(command: str, condition: Callable[[Path, Path], tuple[bool, str]], template: Path, area: Path,
                  ) -> str | None:
    """Build the condition in `area`, run the command on it, and say what went wrong (or None)."""
    area.mkdir()
    target = area / "store"
    as_nobody, message = condition(template, target)
    mnt = area / "mnt"
    mnt.mkdir()
    if as_nobody:
        os.chown(mnt, NOBODY_UID, NOGROUP_GID)
        let_nobody_in(area)
    before = fingerprint(target), fingerprint(mnt)
    r = cli(*(a.format(T=target, M=mnt) for a in COMMANDS[command]), as_nobody=as_nobody)
    damage = command == "fsck" and condition is garbage_catalog  # fsck's finding, not bad input
    problem = check_rejected(r, expected_for(command, condition.__name__, message), code=1 if damage else 2)
    if problem is None and (fingerprint(target), fingerprint(mnt)) != before:
        problem = "the store changed"
    return problem


@pytest.mark.parametrize("command", list(COMMANDS))
def test_bad_store(command: str, template: Path, tmp_path: Path) -> None:
    """The command on every condition (a few at a time); every failure is listed."""
    with ThreadPoolExecutor(4) as pool:
        results = pool.map(lambda c: (c.__name__, run_condition(command, c, template, tmp_path / c.__name__)),
                           CONDITIONS)
        problems = [f"{name}: {problem}" for name, problem in results if problem]
    assert not problems, f"cowfs {' '.join(COMMANDS[command])} on bad stores:\n" + "\n".join(problems)


# -- bad names and arguments, on an unmounted and on a mounted store ---------------------------

ARGUMENTS: list[tuple[tuple[str, ...], str]] = [
    (("snapshot", "create", "{T}", ".hidden"), "invalid snapshot name"),
    (("snapshot", "create", "{T}", "@gen"), "invalid snapshot name"),
    (("snapshot", "create", "{T}", "a/b"), "invalid snapshot name"),
    (("snapshot", "create", "{T}", ""), "invalid snapshot name"),
    (("snapshot", "create", "{T}", "x" * 256), "invalid snapshot name"),
    (("snapshot", "create", "{T}", "one"), "snapshot 'one' already exists"),
    (("snapshot", "delete", "{T}", "nope"), "no snapshot named 'nope'"),
    (("snapshot", "delete", "{T}", "one", "nope"), "no snapshot named 'nope'"),  # and 'one' stays
    (("snapshot", "delete", "{T}", ""), "no snapshot named ''"),
    (("snapshot", "delete", "{T}", "../one"), "no snapshot named '../one'"),
    (("cat", "{T}", "/run/model.pt", "--snapshot", "nope"), "no snapshot named 'nope'"),
    (("cat", "{T}", "/run/model.pt", "--snapshot", ""), "no snapshot named ''"),
    (("ls", "{T}", "/run", "--snapshot", "nope"), "no snapshot named 'nope'"),
    (("restore", "{T}", "/run/model.pt", "--snapshot", "nope"), "no snapshot named 'nope'"),
    (("restore", "{T}", "/run/model.pt", "--snapshot", ""), "no snapshot named ''"),
    (("cat", "{T}", "/run/model.pt", "--generation", "0"), "no generation 0"),
    (("ls", "{T}", "/run", "--generation", "-1"), "no generation -1"),
    (("cat", "{T}", "/run/model.pt", "--generation", "99999999999999999999999"), "no generation 99999999999999999999999"),
    (("restore", "{T}", "/run/model.pt", "--generation", "1000000"), "no generation 1000000"),
    (("cat", "{T}", "/run/missing.pt"), "no such file or directory"),
    (("cat", "{T}", "/run"), "is a directory"),
    (("log", "{T}", "/run/missing.pt"), "never existed"),
    (("restore", "{T}", "/run/model.pt", "--snapshot", "one", "--to", "/nodir/model.pt"), "no such file or directory"),
    (("prune", "{T}"), "no keep rule given"),
    (("remote", "push", "{T}"), "no remote set"),
    (("remote", "gc", "{T}"), "no remote set"),
    (("remote", "gc", "{T}", "--grace", "soon"), "not a duration"),
    (("remote", "gc", "{T}", "--grace", "0"), "not a duration"),
    (("remote", "gc", "{T}", "--grace", "1s"), "--grace 1s is too short: at least 2s"),
    (("remote", "fsck", "{T}"), "no remote set"),
    (("remote", "fsck", "{T}", "--deep"), "no remote set"),
    (("remote", "set", "{T}", "http://bucket/x"), "a remote is written s3://BUCKET/PREFIX"),
    (("remote", "set", "{T}", "s3://Bad_Bucket/x"), "is not a valid bucket name"),
    (("remote", "set", "{T}", "s3://bucket/x", "--endpoint", "ftp://h"), "the endpoint is an http:// or https:// URL"),
    (("remote", "set", "{T}", "s3://bucket/x", "--local-limit", "lots"), "not a size"),
    (("remote", "set", "{T}", "s3://bucket/x", "--fetch-cache", "1M"), "give at least 16 MiB"),
    (("prune", "{T}", "--keep-last", "-1"), "--keep-last must be 0 or more"),
    (("prune", "{T}", "--keep-daily", "-3", "--dry-run"), "--keep-daily must be 0 or more"),
    (("prune", "{T}", "--keep-within", "soon"), "not a duration"),
]


@pytest.mark.parametrize("args, message", ARGUMENTS, ids=[case_id(a) for a, _ in ARGUMENTS])
def test_bad_arguments_unmounted(args: tuple[str, ...], message: str, template: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    _copy(template, store)
    before = fingerprint(store)
    assert_rejected(cli(*(a.format(T=store) for a in args)), message)
    assert fingerprint(store) == before, "the store changed"


def test_a_bad_gil_switch_interval_is_refused_before_mounting(template: Path, tmp_path: Path) -> None:
    """COWFS_GIL_SWITCH_MS out of range or not a number: one line, nothing mounted or changed."""
    store, mnt = tmp_path / "store", tmp_path / "mnt"
    _copy(template, store)
    mnt.mkdir()
    before = fingerprint(store), fingerprint(mnt)
    for bad in ("fast", "0", "500"):
        r = subprocess.run([sys.executable, "-m", "cowfs.cli", "mount", str(store), str(mnt)], capture_output=True,
                           timeout=120, stdin=subprocess.DEVNULL, cwd="/", env={**os.environ, "COWFS_GIL_SWITCH_MS": bad})
        assert_rejected(r, "COWFS_GIL_SWITCH_MS")
    assert (fingerprint(store), fingerprint(mnt)) == before and not os.path.ismount(mnt)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """One store, mounted for the module's mounted cases (none may change it); fsck'ed after."""
    base = tmp_path_factory.mktemp("mounted")
    store = make_store(base / "store")
    with mounted(store, base / "mnt") as mnt:
        yield store, mnt
    assert_clean(store)


@pytest.mark.mount
@pytest.mark.parametrize("args, message", ARGUMENTS, ids=[case_id(a) for a, _ in ARGUMENTS])
def test_bad_arguments_mounted(args: tuple[str, ...], message: str, live: tuple[Path, Path]) -> None:
    store, mnt = live
    before = fingerprint(store)
    assert_rejected(cli(*(a.format(T=mnt) for a in args)), message)
    assert fingerprint(store) == before, "the store (or the daemon's log) changed"


UNREACHABLE: list[tuple[str, ...]] = [("remote", "gc", "{T}"), ("remote", "gc", "{T}", "--grace", "2s"),
                                     ("remote", "fsck", "{T}", "--deep")]


@pytest.mark.parametrize("args", UNREACHABLE, ids=[case_id(a) for a in UNREACHABLE])
def test_remote_gc_and_fsck_with_an_endpoint_that_does_not_answer(args: tuple[str, ...], template: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from cowfs.remote.config import RemoteConfig, write_remote_config

    store = tmp_path / "store"
    _copy(template, store)
    write_remote_config(store, RemoteConfig("s3://ckpts/p", endpoint="http://127.0.0.1:1"))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-a-real-secret")
    before = fingerprint(store)
    assert_rejected(cli(*(a.format(T=store) for a in args)), "cannot reach the endpoint")
    assert fingerprint(store) == before, "the store changed"


# -- mount, umount, fsck and init around a mounted store ---------------------------------------

def _other_store(tmp: Path, store: Path, mnt: Path) -> Path:
    return make_store(tmp / "other")


def _a_file(tmp: Path, store: Path, mnt: Path) -> Path:
    (tmp / "file").write_bytes(b"x")
    return tmp / "file"


def _non_empty(tmp: Path, store: Path, mnt: Path) -> Path:
    (tmp / "full").mkdir()
    (tmp / "full" / "x").write_bytes(b"x")
    return tmp / "full"


def _empty(tmp: Path, store: Path, mnt: Path) -> Path:
    (tmp / "empty").mkdir()
    return tmp / "empty"


# (arguments with {S} = the mounted store, {M} = its mountpoint, {X} = what `extra` makes), message
MOUNTED_CASES: list[tuple[tuple[str, ...], Callable[[Path, Path, Path], Path] | None, str]] = [
    (("mount", "{S}", "{X}"), _empty, "store is already mounted or in use"),
    (("mount", "{S}", "{M}"), None, "something is already mounted there"),
    (("mount", "{X}", "{M}"), _other_store, "something is already mounted there"),
    (("mount", "{X}", "{X}/../mnt-missing"), _other_store, "mountpoint does not exist"),
    (("mount", "{S}", "{X}"), _a_file, "mountpoint is not a directory"),
    (("mount", "{S}", "{X}"), _non_empty, "mountpoint is not empty"),
    (("mount", "{S}", "{X}", "--auto-snapshot", "often"), _empty, "not a duration"),
    (("mount", "{S}", "{X}", "--compact-idle", "when-quiet"), _empty, "not a duration"),
    (("mount", "{S}", "{X}", "--workers", "0"), _empty, "--workers must be between 1 and 1024"),
    (("umount", "{X}"), _empty, "no cowfs filesystem is mounted there"),
    (("umount", "{X}"), _a_file, "no cowfs filesystem is mounted there"),
    (("umount", "{X}/../nowhere"), _empty, "no such directory"),
    (("umount", "{S}"), None, "no cowfs filesystem is mounted there"),
    (("fsck", "{S}", "--repair"), None, "the store is mounted"),
    (("fsck", "{M}", "--repair"), None, "the store is mounted"),
    (("init", "{S}"), None, "already a cowfs store"),
    (("init", "{M}"), None, "directory is not empty"),
]


@pytest.mark.mount
@pytest.mark.parametrize("args, extra, message", MOUNTED_CASES,
                         ids=[f"{case_id(a)} ({x.__name__.strip('_').replace('_', ' ')})" if x else case_id(a) for a, x, _ in MOUNTED_CASES])
def test_mount_umount_fsck_init_around_a_mounted_store(args: tuple[str, ...], extra: Callable[[Path, Path, Path], Path] | None,
                                                       message: str, live: tuple[Path, Path], tmp_path: Path) -> None:
    store, mnt = live
    x = extra(tmp_path, store, mnt) if extra else tmp_path
    before = fingerprint(store), fingerprint(tmp_path)
    assert_rejected(cli(*(a.format(S=store, M=mnt, X=x) for a in args)), message)
    assert (fingerprint(store), fingerprint(tmp_path)) == before, "a store or directory changed"
    assert (mnt / "run" / "model.pt").read_bytes() == data(300_000, 2)  # the mount still serves


def test_umount_relative_path_of_a_plain_directory(tmp_path: Path) -> None:
    """umount of a directory nothing was ever mounted on, given relative and with a trailing slash."""
    (tmp_path / "plain").mkdir()
    before = fingerprint(tmp_path)
    r = subprocess.run([sys.executable, "-m", "cowfs.cli", "umount", "plain/"], capture_output=True, timeout=60,
                       cwd=tmp_path, stdin=subprocess.DEVNULL)
    assert_rejected(r, "no cowfs filesystem is mounted there")
    assert fingerprint(tmp_path) == before


# -- init into what is not a new store ----------------------------------------------------------

def _init_into_file(tmp: Path, template: Path) -> Path:
    (tmp / "f").write_bytes(b"x")
    return tmp / "f"


def _init_under_file(tmp: Path, template: Path) -> Path:
    (tmp / "f").write_bytes(b"x")
    return tmp / "f" / "store"


def _init_into_non_empty(tmp: Path, template: Path) -> Path:
    random_files(template, tmp / "d")
    return tmp / "d"


def _init_into_store(tmp: Path, template: Path) -> Path:
    _copy(template, tmp / "s")
    return tmp / "s"


def _init_into_newer_store(tmp: Path, template: Path) -> Path:
    newer_format(template, tmp / "s")
    return tmp / "s"


def _init_into_garbage_config(tmp: Path, template: Path) -> Path:
    garbage_config(template, tmp / "s")
    return tmp / "s"


def _init_new(tmp: Path, template: Path) -> Path:
    return tmp / "new"


INIT_CASES: list[tuple[Callable[[Path, Path], Path], tuple[str, ...], bool, str]] = [
    (_init_into_file, (), False, "exists and is not a directory"),
    (_init_under_file, (), False, "File exists"),
    (_init_into_non_empty, (), False, "directory is not empty"),
    (_init_into_store, (), False, "already a cowfs store"),
    (_init_into_newer_store, (), False, "already a cowfs store"),
    (_init_into_garbage_config, (), False, "already a cowfs store"),
    (_init_new, ("--segment-size", "12x"), False, "not a size"),
    (_init_new, ("--segment-size", "1M"), False, "segment size must be"),
    (_init_new, ("--segment-size", "5000001"), False, "segment size must be"),
    (_init_new, ("--segment-size", "0"), False, "size must be positive"),
    (_init_new, (), True, "Permission denied"),  # the unprivileged user in root's directory
]


@pytest.mark.parametrize("where, extra, as_nobody, message", INIT_CASES,
                         ids=[" ".join([w.__name__.strip("_").replace("_", " "), *x] + (["as nobody"] if n else []))
                              for w, x, n, _ in INIT_CASES])
def test_init_refuses(where: Callable[[Path, Path], Path], extra: tuple[str, ...], as_nobody: bool, message: str,
                      template: Path, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    area = tmp_path / "area"
    area.mkdir()
    target = where(area, template)
    if as_nobody:
        let_nobody_in(area)
    before = fingerprint(area)
    assert_rejected(cli("init", str(target), *extra, as_nobody=as_nobody), message)
    assert fingerprint(area) == before, "init left something behind or changed what was there"
