"""The store directory: its files, the format/config file, and `init`.

STORE/
  cowfs-store.json   format + config (see docs/format.md)
  catalog.db         SQLite catalog (+ -wal, -shm)
  segments/          append-only log segments, NNNNNNNNNNNNNNNN.seg
  lock               flock()ed by the process that owns the store; holds its pid
  tmp/               spill files of open write sessions (unlinked; cleared at open)
"""
from __future__ import annotations

import fcntl
import json
import os
import uuid
from dataclasses import dataclass
from pathlib import Path

from ...errors import Busy, StoreError

FORMAT_NAME = "cowfs-store"
FORMAT_VERSION = 7  # 2: encoded records and their catalog columns; 3: lineage by generation; 4: versions.nlink;
# 5: atime, rdev, xattrs and special files in the catalog; 6: records of codec 4 (fdelta); 7: records of codec 5
# (fdelta32); `cowfs upgrade` migrates versions 1-6
OLDEST_UPGRADABLE = 1
CONFIG_FILE = "cowfs-store.json"
CATALOG_FILE = "catalog.db"
SEGMENTS_DIR = "segments"
LOCK_FILE = "lock"

MAX_CHAIN = 4  # records a read of one piece may touch: itself and up to 3 bases (docs/format.md section 3.2)
DEVICES = ("file", "direct", "pmem")
DEFAULT_DEVICE = "direct"  # O_DIRECT appends; chosen by the benchmark (docs/benchmarks.md, third round)
DEFAULT_SEGMENT_SIZE = 256 << 20
MIN_SEGMENT_SIZE = 4 << 20
MAX_SEGMENT_SIZE = 1 << 40


@dataclass(frozen=True)
class StoreConfig:
    """The contents of cowfs-store.json."""

    store_uuid: str
    device: str
    segment_size: int
    format_version: int = FORMAT_VERSION
    read_chain: int = MAX_CHAIN  # records a read of one compacted piece may touch (1: no deltas); compaction keeps to it

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": FORMAT_NAME,
                "format_version": self.format_version,
                "store_uuid": self.store_uuid,
                "device": self.device,
                "segment_size": self.segment_size,
                "read_chain": self.read_chain,
            },
            indent=2,
        ) + "\n"


def segment_path(root: Path, seg_id: int) -> Path:
    return root / SEGMENTS_DIR / f"{seg_id:016d}.seg"


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def check_new_store_dir(root: Path) -> None:
    """Init only into a missing or empty directory; otherwise touch nothing."""
    if root.exists() and not root.is_dir():
        raise StoreError(f"{root}: exists and is not a directory")
    if (root / CONFIG_FILE).exists():
        raise StoreError(f"{root}: already a cowfs store")
    if root.is_dir() and any(root.iterdir()):
        raise StoreError(f"{root}: directory is not empty")


def new_config(device: str, segment_size: int, read_chain: int = MAX_CHAIN) -> StoreConfig:
    if device not in DEVICES:
        raise StoreError(f"unknown device {device!r} (choose from {', '.join(DEVICES)})")
    if not MIN_SEGMENT_SIZE <= segment_size <= MAX_SEGMENT_SIZE or segment_size % 4096:
        raise StoreError(
            f"segment size must be a multiple of 4096 between {MIN_SEGMENT_SIZE >> 20} MiB and 1 TiB"
        )
    check_read_chain(read_chain)
    return StoreConfig(store_uuid=str(uuid.uuid4()), device=device, segment_size=segment_size, read_chain=read_chain)


def check_read_chain(read_chain: object) -> None:
    if not isinstance(read_chain, int) or isinstance(read_chain, bool) or not 1 <= read_chain <= MAX_CHAIN:
        raise StoreError(f"read chain must be 1 to {MAX_CHAIN} records, not {read_chain!r}")


def set_read_chain(root: Path, read_chain: int) -> tuple[int, int]:
    """Change the store's read chain, the store not in use (its lock is taken); returns
    (before, after). The config file is replaced whole (write_durably), its other keys as they
    were. Pieces compacted before keep their chains (at most MAX_CHAIN records)."""
    check_read_chain(read_chain)
    before = read_config(root).read_chain  # a store of this format version, or StoreError
    try:
        fd = take_lock(root, "the store")
    except Busy as e:
        raise Busy(f"{e}: unmount it first") from None
    try:
        data = config_data(root)
        data["read_chain"] = read_chain
        write_durably(root / CONFIG_FILE, json.dumps(data, indent=2) + "\n")
    finally:
        os.close(fd)
    return before, read_chain


def write_durably(path: Path, text: str | bytes) -> None:
    """Replace `path` with `text` whole or not at all: a tmp file, fsync, rename, fsync of the directory."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb" if isinstance(text, bytes) else "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, path)
    fsync_dir(path.parent)


def take_lock(root: Path, what: str) -> int:
    """flock `root/lock` for this process and write its pid there; Busy (naming the holder's
    pid) when another process holds it. Returns the descriptor, held until closed."""
    fd = os.open(root / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
        os.close(fd)
        raise Busy(f"{root}: {what} is in use by another process{f' (pid {holder})' if holder else ''}") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def write_config(root: Path, cfg: StoreConfig) -> None:
    root.mkdir(parents=True, exist_ok=True)
    (root / SEGMENTS_DIR).mkdir(exist_ok=True)
    write_durably(root / CONFIG_FILE, cfg.to_json())


def config_data(root: Path) -> dict:
    """The store config as JSON, whatever its format version (StoreError if there is none)."""
    if not root.exists():
        raise StoreError(f"{root}: no such directory")
    path = root / CONFIG_FILE
    if not path.is_file():
        raise StoreError(f"{root}: not a cowfs store (no {CONFIG_FILE})")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise StoreError(f"{path}: unreadable store config ({e})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT_NAME:
        raise StoreError(f"{path}: not a cowfs store config")
    return data


def read_config(root: Path) -> StoreConfig:
    data = config_data(root)
    path = root / CONFIG_FILE
    version = data.get("format_version")
    if isinstance(version, int) and OLDEST_UPGRADABLE <= version < FORMAT_VERSION:
        raise StoreError(f"{root}: store format version {version} is older than this cowfs's ({FORMAT_VERSION}): "
                         f"run `cowfs upgrade {root}` while it is not mounted")
    if version != FORMAT_VERSION:
        raise StoreError(
            f"{root}: store format version {version} is not supported "
            f"(this cowfs reads version {FORMAT_VERSION})"
        )
    read_chain = data.get("read_chain", MAX_CHAIN)  # stores made before the setting: the format's bound
    try:
        check_read_chain(read_chain)
    except StoreError as e:
        raise StoreError(f"{path}: {e}") from None
    try:
        cfg = StoreConfig(
            store_uuid=str(data["store_uuid"]),
            device=str(data["device"]),
            segment_size=int(data["segment_size"]),
            read_chain=read_chain,
        )
    except (KeyError, TypeError, ValueError) as e:
        raise StoreError(f"{path}: store config is missing a field ({e})") from None
    if cfg.device not in DEVICES:
        raise StoreError(f"{path}: unknown device {cfg.device!r}")
    if not MIN_SEGMENT_SIZE <= cfg.segment_size <= MAX_SEGMENT_SIZE or cfg.segment_size % 4096:
        raise StoreError(f"{path}: invalid segment_size {cfg.segment_size}")
    if not (root / SEGMENTS_DIR).is_dir():
        raise StoreError(f"{root}: store has no {SEGMENTS_DIR}/ directory")
    return cfg
