"""Helpers shared by engine tests: make stores on either device, and fsck them."""
from __future__ import annotations

import errno
import os
import random
from pathlib import Path

from cowfs.service_remote import pack_reader
from cowfs.store import ROOT_INO, Store


def new_store(path: Path, device: str = "file", segment_size: int = 4 << 20) -> Path:
    Store.init(path, device=device, segment_size=segment_size)
    return path


def assert_clean(path: Path) -> None:
    with Store.open(path, pack_reader=pack_reader) as store:  # an evicted segment's reads need its remote
        report = store.fsck()
    assert report.clean, "\n".join(p.line() for p in report.problems)


def data(n: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(n)


def store_with_history(path: Path, size: int) -> Path:
    """A new store holding /run/model.pt with two versions of `size` bytes (seeds 1 and 2),
    the first one in snapshot "one"."""
    new_store(path)
    with Store.open(path) as s:
        s.mkdir(ROOT_INO, b"run")
        s.write_file("/run/model.pt", data(size, 1))
        s.snapshot_create("one")
        s.write_file("/run/model.pt", data(size, 2))
    return path


def fill(dev: Path, leave: int = 0) -> Path:
    """Fill the device with a filler file until at most `leave` bytes are free."""
    filler = dev / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        while free_bytes(dev) > leave:
            n = min(64 << 10, free_bytes(dev) - leave)
            os.write(fd, b"\xa5" * max(n, 4096))
    except OSError as e:
        assert e.errno == errno.ENOSPC, e
    finally:
        os.close(fd)
    return filler


def free_bytes(dev: Path) -> int:
    st = os.statvfs(dev)
    return st.f_bavail * st.f_frsize


def damage_middle_chunk(store_path: Path, path: str) -> tuple[int, int]:
    """Flip one payload byte of the middle chunk of `path` in its segment file (the store
    closed); returns that chunk's (file offset, length)."""
    from cowfs.store.log.layout import segment_path

    with Store.open(store_path) as s:
        with s.open_reader(s.resolve(path).ino) as r:
            e = r.extents[len(r.extents) // 2]
    assert e.loc is not None
    with open(segment_path(store_path, e.loc.seg_id), "r+b") as seg:
        at = e.loc.offset + 64 + e.length // 2
        seg.seek(at)
        old = seg.read(1)
        seg.seek(at)
        seg.write(bytes([old[0] ^ 0xFF]))
    return e.offset, e.length
