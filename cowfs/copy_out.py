"""`cowfs restore TARGET PATH --snapshot NAME --into DIR`: a file or directory of a snapshot
copied out of a mount into a directory of any file system (a node's local disk, another
mount): the way to restore from a read-only mount, a consumer's or the union of a job's
stores, whose snapshots are pinned in the bucket.

The bytes are read through the mount (`MOUNTPOINT/.snapshots/NAME/PATH`), so every chunk is
checked as every read is and the kernel checks permissions; they are written into a new
directory beside DIR (`.DIR.cowfs-restore-RANDOM`), each file fsynced, then the directories,
and renamed to DIR last: killed at any point, DIR is either absent or whole (the partial
copy beside it is deleted by the next restore into DIR).
"""
from __future__ import annotations

import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

from .errors import Exists, InvalidArgument, NotFound
from .mountinfo import mounted_cowfs
from .store.log.layout import fsync_dir

PIECE = 8 << 20  # bytes per read while copying


@dataclass
class Copied:
    files: int = 0
    bytes: int = 0


def mountpoint_of(target: str) -> Path:
    """The mountpoint of TARGET (a mountpoint, or a mounted store's or cache's directory)."""
    path = Path(target).absolute()
    mounts = mounted_cowfs()
    if str(path) in mounts:
        return path
    for mnt, store in mounts.items():
        if Path(store) == path:
            return Path(mnt)
    raise InvalidArgument(f"{target}: --into reads through the mount: mount it first (cowfs mount)")


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _copy_file(src: Path, dest: Path, done: Copied) -> None:
    with open(src, "rb") as fin, open(dest, "xb") as fout:
        while piece := fin.read(PIECE):
            fout.write(piece)
            done.bytes += len(piece)
        fout.flush()
        os.fsync(fout.fileno())
    done.files += 1


def _copy(src: Path, dest: Path, done: Copied, dirs: list[tuple[Path, os.stat_result]]) -> None:
    st = src.lstat()
    if stat.S_ISDIR(st.st_mode):
        dest.mkdir()
        for child in sorted(src.iterdir()):
            _copy(child, dest / child.name, done, dirs)
        dirs.append((dest, st))
    elif stat.S_ISREG(st.st_mode):
        _copy_file(src, dest, done)
    elif stat.S_ISLNK(st.st_mode):
        os.symlink(os.readlink(src), dest)
        return
    else:  # fifos, sockets, device nodes: their metadata only, as the store keeps them
        os.mknod(dest, st.st_mode, st.st_rdev)
    if not stat.S_ISDIR(st.st_mode):
        os.chmod(dest, stat.S_IMODE(st.st_mode))
        os.utime(dest, ns=(st.st_atime_ns, st.st_mtime_ns))


def copy_out(mountpoint: Path, snapshot: str, path: str, into: Path) -> Copied:
    """Copy `path` as of `snapshot` out of the mount at `mountpoint` to `into` (see the module text)."""
    src = mountpoint / ".snapshots" / snapshot / path.lstrip("/")
    if not os.path.lexists(src):
        raise NotFound(f"{path}: not in snapshot {snapshot}")
    into = into.absolute()
    if os.path.lexists(into):
        raise Exists(f"{into}: exists already (--into makes it)")
    if not into.parent.is_dir():
        raise NotFound(f"{into.parent}: no such directory")
    for stale in into.parent.glob(f".{into.name}.cowfs-restore-*"):  # a restore killed before its rename
        _remove(stale)
    work = into.parent / f".{into.name}.cowfs-restore-{os.urandom(4).hex()}"
    done = Copied()
    dirs: list[tuple[Path, os.stat_result]] = []
    try:
        _copy(src, work, done, dirs)
        for d, st in dirs:  # deepest first (appended after their children): the times stay
            os.chmod(d, stat.S_IMODE(st.st_mode))
            os.utime(d, ns=(st.st_atime_ns, st.st_mtime_ns))
            fsync_dir(d)
        os.rename(work, into)
    except BaseException:
        _remove(work)
        raise
    fsync_dir(into.parent)
    return done

