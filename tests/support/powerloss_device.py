"""A simulated disk for power-loss tests: segment files whose non-durable state can be thrown away.

`Disk` keeps, for every segment file of one store, what a power loss would leave
of it: the byte image as of its last durability point (`persist()`, the fsync in
`truncate()`) and whether its directory entry is durable (an fsync of the
segments directory after it was created or unlinked). The engine's segment
classes are replaced (through `cowfs.store.log.log.segment_class`, where the log and
recovery look them up) by subclasses that forward every call to the real code
and report to the `Disk`:

  write / punch     the 4 KiB pages touched become dirty (not durable); write_aligned too
                    (direct: the log's aligned appends, O_DIRECT from the caller's buffer)
  persist           file, direct: fdatasync, so every dirty page and the size become durable
                    (direct: after its held partial block was written);
                    pmem: only the pages in the range `_native.persist` was asked to
                    flush (recorded through a proxy of `cowfs._native`), so a dirty
                    range the engine forgot to flush stays non-durable
  truncate          ftruncate + fsync: everything durable
  create            a new file whose directory entry is not durable
  fsync_dir         (the log's `fsync_dir`) entries of existing files become durable,
                    entries of unlinked files are durably gone

Crash points: every call above, and every catalog transaction (`Catalog.write`)
both before it runs and after it committed, bumps a counter; when the counter
reaches the armed value the `Disk` dies: the call raises `PowerLoss` without
doing anything, and every later device call or catalog write on any thread
does the same, so nothing after the crash instant has an effect.

`power_loss(mode)` then rewrites the segments directory to what the disk holds
after the power comes back:

  "drop"  everything not durable is lost: dirty pages and size changes revert to
          the durable image, files whose entry is not durable vanish, files
          unlinked since the last directory fsync come back;
  "torn"  any subset of it survived: each dirty page independently keeps its new
          or its durable bytes, a pending size change may or may not have
          happened, a non-durable create or unlink may or may not have happened.

The catalog needs no simulation: it is SQLite in WAL mode with synchronous=FULL,
so a transaction is durable when COMMIT returns, and none commits after the
crash instant. The test drops the store object without closing it.
"""
from __future__ import annotations

import mmap
import os
import random
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from cowfs.store.catalog import db as catalog_mod
from cowfs.store.log import device as device_mod
from cowfs.store.log import log as log_mod
from cowfs.store.log import pmem as pmem_mod
from cowfs.store.log.device import DirectFileSegment, FileSegment
from cowfs.store.log.pmem import PmemSegment

PAGE = 4096


class PowerLoss(BaseException):
    """The power went out (BaseException: no `except Exception` in the engine swallows it)."""


@dataclass
class FileState:
    entry_durable: bool
    image: bytearray | None  # durable bytes (and so durable size); None: nothing durable yet
    dirty: set[int] = field(default_factory=set)  # pages changed since they were last made durable


def _pages(offset: int, length: int) -> range:
    if length <= 0:
        return range(0)
    return range(offset // PAGE, (offset + length - 1) // PAGE + 1)


def _read_all(fd: int) -> bytes:
    size = os.fstat(fd).st_size
    parts = []
    pos = 0
    while pos < size:
        b = os.pread(fd, min(size - pos, 8 << 20), pos)
        if not b:
            break
        parts.append(b)
        pos += len(b)
    return b"".join(parts)


class Disk:
    def __init__(self, seg_dir: Path, rng: random.Random) -> None:
        self.seg_dir = Path(seg_dir)
        self.rng = rng
        self.lock = threading.RLock()
        self.files: dict[str, FileState] = {}
        self.counter = 0  # crash points passed while armed
        self.crash_at: int | None = None
        self.dead = False
        self.crash_site: str | None = None
        self.committed: list[str] = []  # op names of the catalog transactions that committed, in order
        self.sites: Counter[str] = Counter()  # crash sites hit
        self.persists = 0
        # existing segments (a store reopened under the simulation) count as durable
        for p in sorted(self.seg_dir.glob("*.seg")):
            with open(p, "rb") as f:
                self.files[str(p)] = FileState(True, bytearray(f.read()))

    # -- crash points ----------------------------------------------------------------

    def arm(self, after: int) -> None:
        """Die at the `after`-th crash point from now."""
        with self.lock:
            self.crash_at = self.counter + after

    def disarm(self) -> None:
        with self.lock:
            self.crash_at = None

    def point(self, kind: str, detail: str = "", on_crash=None) -> None:  # type: ignore[no-untyped-def]
        """A crash point; call with `lock` held. `on_crash` does the half of the call that happens anyway."""
        site = f"{kind} {detail}".strip()
        if self.dead:
            raise PowerLoss(f"after power loss: {site}")
        if self.crash_at is None:
            return
        self.counter += 1
        if self.counter >= self.crash_at:
            if on_crash is not None:
                on_crash()
            self.dead = True
            self.crash_site = site
            self.crash_at = None
            self.sites[kind] += 1
            raise PowerLoss(site)

    # -- events from the segment classes ----------------------------------------------

    def _state(self, path: Path) -> FileState:
        key = str(path)
        st = self.files.get(key)
        if st is None:  # opened but never seen: it was there before the simulation started
            with open(path, "rb") as f:
                st = self.files[key] = FileState(True, bytearray(f.read()))
        return st

    def created(self, path: Path) -> None:
        key = str(path)
        old = self.files.get(key)
        if old is not None and old.entry_durable:
            raise AssertionError(f"{path.name} created again while an older file of that name may come back")
        self.files[key] = FileState(False, None)

    def opened(self, path: Path) -> None:
        self._state(path)

    def touched(self, path: Path, offset: int, length: int) -> None:
        self._state(path).dirty.update(_pages(offset, length))

    def made_durable(self, path: Path, fd: int, ranges: list[tuple[int, int]] | None) -> None:
        """fdatasync (ranges None: the whole file) or a ranged flush (pmem)."""
        st = self._state(path)
        size = os.fstat(fd).st_size
        if st.image is None:
            st.image = bytearray(size)
        elif len(st.image) != size:
            if len(st.image) > size:
                del st.image[size:]
            else:
                st.image.extend(bytes(size - len(st.image)))
        if ranges is None:
            todo = set(st.dirty)
        else:
            todo = set()
            for off, n in ranges:
                todo.update(p for p in _pages(off, n) if p in st.dirty)
        for p in todo:
            lo = p * PAGE
            if lo < size:
                chunk = os.pread(fd, min(PAGE, size - lo), lo)
                st.image[lo:lo + len(chunk)] = chunk
            st.dirty.discard(p)
        self.persists += 1

    def dir_synced(self, path: Path) -> None:
        if Path(path).resolve() != self.seg_dir.resolve():
            return
        for key in list(self.files):
            if os.path.exists(key):
                self.files[key].entry_durable = True
            else:
                del self.files[key]

    # -- the power goes out --------------------------------------------------------------

    def power_loss(self, mode: str) -> dict[str, int]:
        """Rewrite the segments directory to what survives; call after the store was dropped."""
        assert mode in ("drop", "torn")
        torn = mode == "torn"
        rng = self.rng
        out = Counter()
        with self.lock:
            for p in self.seg_dir.glob("*.seg"):
                if str(p) not in self.files:  # never made through the simulation: not durable
                    p.unlink()
                    out["stray_removed"] += 1
            for key, st in list(self.files.items()):
                exists = os.path.exists(key)
                if not st.entry_durable:
                    if not (torn and exists and rng.random() < 0.5):
                        if exists:
                            os.unlink(key)
                        del self.files[key]
                        out["vanished"] += 1
                        continue
                    out["kept_new"] += 1
                elif not exists:
                    if torn and rng.random() < 0.5:  # the unlink reached the disk
                        del self.files[key]
                        out["unlinked"] += 1
                        continue
                    out["came_back"] += 1
                durable = st.image if st.image is not None else bytearray()
                cur = b""
                if exists:
                    fd = os.open(key, os.O_RDONLY)
                    try:
                        cur = _read_all(fd)
                    finally:
                        os.close(fd)
                size = len(durable)
                if torn and exists and len(cur) != size and rng.random() < 0.5:
                    size = len(cur)
                final = bytearray(durable[:size])
                final.extend(bytes(size - len(final)))
                lost = 0
                for p in st.dirty:
                    lo = p * PAGE
                    if lo >= size:
                        continue
                    hi = min(lo + PAGE, size)
                    if torn and exists and rng.random() < 0.5:
                        new = cur[lo:hi]
                        final[lo:lo + len(new)] = new
                    else:
                        lost += 1
                out["pages_lost"] += lost
                out["pages_dirty"] += len(st.dirty)
                if not exists or bytes(final) != cur:
                    fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                    try:
                        view = memoryview(final)
                        pos = 0
                        while pos < len(view):
                            pos += os.pwrite(fd, view[pos:], pos)
                    finally:
                        os.close(fd)
                    out["files_rewritten"] += 1
                st.image = final
                st.dirty = set()
                st.entry_durable = True
            self.dead = False
            self.crash_site = None
            self.crash_at = None
        return dict(out)


# -- the segment classes the log gets while a Disk is installed ---------------------------

DISK: Disk | None = None
_tls = threading.local()


def _disk() -> Disk:
    assert DISK is not None, "no Disk installed"
    return DISK


class PLFileSegment(FileSegment):
    @classmethod
    def create(cls, path: Path, size: int) -> "PLFileSegment":
        d = _disk()
        with d.lock:
            d.point("create", path.name)
            seg = super().create(path, size)
            d.created(path)
        return seg  # type: ignore[return-value]

    @classmethod
    def open(cls, path: Path, writable: bool = True) -> "PLFileSegment":
        seg = super().open(path, writable)
        with _disk().lock:
            _disk().opened(path)
        return seg  # type: ignore[return-value]

    def write(self, offset: int, data: bytes | bytearray | memoryview) -> None:
        d = _disk()
        with d.lock:
            d.point("write", f"{self.path.name}@{offset}+{len(data)}")
            super().write(offset, data)
            d.touched(self.path, offset, len(data))

    def write_parts(self, offset: int, parts: list[bytes | memoryview]) -> None:
        n = sum(len(p) for p in parts)
        d = _disk()
        with d.lock:
            d.point("write", f"{self.path.name}@{offset}+{n}")
            super().write_parts(offset, parts)
            d.touched(self.path, offset, n)

    def write_aligned(self, offset: int, data: memoryview) -> bool:
        d = _disk()
        with d.lock:
            d.point("write", f"{self.path.name}@{offset}+{len(data)}")
            done = super().write_aligned(offset, data)
            if done:
                d.touched(self.path, offset, len(data))
        return done

    def persist(self) -> None:
        d = _disk()
        with d.lock:
            d.point("persist", self.path.name)
            _tls.flushed = {"persist": [], "msync": []}
            super().persist()
            d.made_durable(self.path, self.fd, self._persisted_ranges())

    def _persisted_ranges(self) -> list[tuple[int, int]] | None:
        return None  # fdatasync: the whole file

    def punch(self, offset: int, length: int) -> None:
        d = _disk()
        with d.lock:
            d.point("punch", f"{self.path.name}@{offset}+{length}")
            super().punch(offset, length)
            d.touched(self.path, offset, length)

    def truncate(self, length: int) -> None:
        d = _disk()
        with d.lock:
            d.point("truncate", f"{self.path.name}->{length}")
            # a crash between ftruncate and its fsync: the size change is not durable
            d.point("truncate-unsynced", f"{self.path.name}->{length}", on_crash=lambda: os.ftruncate(self.fd, length))
            super().truncate(length)  # ftruncate + fsync: everything in the file is durable
            d.made_durable(self.path, self.fd, None)

class PLPmemSegment(PLFileSegment, PmemSegment):
    """PmemSegment's own code, but `persist` only makes durable the ranges it actually flushed."""

    def _persisted_ranges(self) -> list[tuple[int, int]] | None:
        """Pages both written back from the CPU caches and msync'ed (the mapping is not MAP_SYNC)."""
        flushed = getattr(_tls, "flushed", {"persist": [], "msync": []})
        cpu = {p for off, n in flushed["persist"] for p in _pages(off, n)}
        synced = {p for off, n in flushed["msync"] for p in _pages(off, n)}
        return [(p * PAGE, PAGE) for p in sorted(cpu & synced)]

    def close(self) -> None:
        d = _disk()
        if d.dead:  # the power is off: no last persist, just let go of the mapping and the fd
            if self.map is not None:
                self.map.close()
                self.map = None
            FileSegment.close(self)
            return
        PmemSegment.close(self)


class PLDirectSegment(PLFileSegment, DirectFileSegment):
    """DirectFileSegment's own code: a write's last partial block stays in memory until
    `persist` (or anything else that needs it on the device) writes it, so a crash before
    that loses it, as the pages it touched being dirty already allows."""

    def close(self) -> None:
        if _disk().dead:  # the power is off: the held block never reaches the device
            self._held_dirty = False
        DirectFileSegment.close(self)


def _record(kind: str, offset: int, length: int) -> None:
    if not hasattr(_tls, "flushed"):
        _tls.flushed = {"persist": [], "msync": []}
    _tls.flushed[kind].append((offset, length))


class _NativeProxy:
    """`cowfs._native` with `persist` (cache-line write-back) recording the ranges it flushed."""

    def __init__(self, real) -> None:  # type: ignore[no-untyped-def]
        self._real = real

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self._real, name)

    def persist(self, buf, offset: int, length: int):  # type: ignore[no-untyped-def]
        r = self._real.persist(buf, offset, length)
        _record("persist", offset, length)
        return r


class _TrackedMmap(mmap.mmap):
    """A mapping whose `flush` (msync) records the range it wrote back."""

    def flush(self, *args):  # type: ignore[no-untyped-def]
        r = super().flush(*args)
        if args:
            _record("msync", args[0], args[1] if len(args) > 1 else len(self) - args[0])
        else:
            _record("msync", 0, len(self))
        return r


class _MmapModuleProxy:
    """The `mmap` module as device.py and pmem.py see it: mappings are `_TrackedMmap`s."""

    mmap = _TrackedMmap

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(mmap, name)


def install(monkeypatch, disk: Disk) -> None:  # type: ignore[no-untyped-def]
    """Route the store's segments, directory fsyncs and catalog writes through `disk`."""
    global DISK
    DISK = disk
    for mod in (device_mod, pmem_mod):  # pmem_mod: PmemSegment's persist and msync
        if not isinstance(mod._native, _NativeProxy):
            monkeypatch.setattr(mod, "_native", _NativeProxy(mod._native))
        if not isinstance(mod.mmap, _MmapModuleProxy):
            monkeypatch.setattr(mod, "mmap", _MmapModuleProxy())

    def seg_class(device: str):  # type: ignore[no-untyped-def]
        return {"pmem": PLPmemSegment, "direct": PLDirectSegment}.get(device, PLFileSegment)

    monkeypatch.setattr(log_mod, "segment_class", seg_class)

    real_fsync_dir = log_mod.fsync_dir if not hasattr(log_mod.fsync_dir, "_pl") else log_mod.fsync_dir._pl

    def fsync_dir(path: Path) -> None:
        d = _disk()
        with d.lock:
            d.point("fsync_dir", Path(path).name)
            real_fsync_dir(path)
            d.dir_synced(path)

    fsync_dir._pl = real_fsync_dir  # type: ignore[attr-defined]
    monkeypatch.setattr(log_mod, "fsync_dir", fsync_dir)

    real_write = catalog_mod.Catalog.write
    real_write = getattr(real_write, "_pl", real_write)

    def write(self, fn, op, durable=True):  # type: ignore[no-untyped-def]
        # (the engine's operations here all commit durably; a lazy commit, FUSE's create, is
        # only made by the mount, whose crash states the kill -9 harness covers)
        assert durable, "the power-loss simulation models durable catalog commits only"
        d = _disk()
        with d.lock:
            d.point(f"catalog-before:{op}")
        result = real_write(self, fn, op, durable)
        with d.lock:
            d.committed.append(op)
            d.point(f"catalog-after:{op}")
        return result

    write._pl = real_write  # type: ignore[attr-defined]
    monkeypatch.setattr(catalog_mod.Catalog, "write", write)
