"""Model-based test: drive the Store API and an in-memory model side by side.

The model is a dict path -> bytearray for files (with their extended attributes; hard
links share one), a set of directory paths, and
for each snapshot a deep copy of both taken when it was created. After every
step the touched files are read back byte-exact and every directory listing is
compared; after gc, a reopen and at the end of each run every file and every
snapshot is read back in full, and the store must fsck clean.

Write sessions mix sequential appends from offset 0 (streaming fast path) with
writes at random offsets, also past EOF (overlay slow path), truncates, reads
checked against the pending state, intermediate commits, and end in commit,
abort (the session then goes on from the committed version) or close. The appends
come in any order (as the kernel's writeback may send them: the reorder window). Each
run also picks the session BATCH and REORDER, so small files already stream in several
batches and overflow the reorder window.
One rule removes a file under an open session and runs expire_history + gc: the
session's view must survive and its commit must store nothing.

Big data is generated from a drawn seed (random.Random(seed).randbytes) so
hypothesis stays fast; it still shrinks sizes, offsets and the order of steps.

HYPOTHESIS_PROFILE=slow runs many more and longer sequences.
"""
from __future__ import annotations

import os
import random
import shutil
import tempfile

import hypothesis.strategies as st
from hypothesis import HealthCheck, note, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import cowfs.store.data.session as session_mod
from cowfs.errors import (
    Exists,
    InvalidArgument,
    IsADirectory,
    NoAttribute,
    NotADirectory,
    NotEmpty,
    NotFound,
    NotPermitted,
)
from cowfs.store import ROOT_INO, Store

KiB, MiB = 1 << 10, 1 << 20
MAX_FILE = 2 * MiB + 256 * KiB  # writes are clipped so no file grows past this
FILE_NAMES = ["f0", "f1", "f2", "f3"]
DIR_NAMES = ["d0", "d1"]
SNAP_NAMES = ["s0", "s1", "s2"]

settings.register_profile(
    "slow", max_examples=400, stateful_step_count=80, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
if os.environ.get("HYPOTHESIS_PROFILE") == "slow":
    SETTINGS = settings.get_profile("slow")
else:
    SETTINGS = settings(
        max_examples=25, stateful_step_count=30, deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


def parent_of(path: str) -> str:
    return path.rsplit("/", 1)[0] or "/"


def name_of(path: str) -> str:
    return path.rsplit("/", 1)[1]


def join(d: str, name: str) -> str:
    return d.rstrip("/") + "/" + name


def is_under(path: str, d: str) -> bool:
    return path == d or path.startswith(d.rstrip("/") + "/")


def put(buf: bytearray, offset: int, data: bytes) -> None:
    """What a write does to a file: zero-fill any gap, then overwrite/extend (0 bytes: nothing)."""
    if not data:
        return
    if offset > len(buf):
        buf.extend(bytes(offset - len(buf)))
    buf[offset:offset + len(data)] = data


def resize(buf: bytearray, size: int) -> None:
    if size < len(buf):
        del buf[size:]
    else:
        buf.extend(bytes(size - len(buf)))


class Body(bytearray):
    """A file in the model: its bytes and its extended attributes, one object shared by
    every hard link of the file (versions and attributes belong to the inode)."""

    def __init__(self, *args: object) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.xattrs: dict[bytes, bytes] = {}


class Snap:
    def __init__(self, gen: int, files: dict[str, Body], dirs: set[str]) -> None:
        self.gen = gen
        self.files = {p: bytes(b) for p, b in files.items()}
        self.xattrs = {p: dict(b.xattrs) for p, b in files.items()}
        self.nlinks = {p: sum(1 for o in files.values() if o is b) for p, b in files.items()}
        self.dirs = set(dirs)


class StoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.mkdtemp(prefix="cowfs-model-")
        self.path = os.path.join(self.tmp, "store")
        Store.init(self.path, segment_size=4 << 20)
        self.store = Store.open(self.path)
        self.files: dict[str, Body] = {}
        self.dirs: set[str] = {"/"}
        self.snaps: dict[str, Snap] = {}
        self._batch, self._reorder, self._hole = session_mod.BATCH, session_mod.REORDER, session_mod.HOLE

    # -- helpers -------------------------------------------------------------------

    def ino(self, path: str, gen: int | None = None) -> int:
        return self.store.resolve(path, gen).ino

    def entries(self) -> list[str]:
        return sorted(self.files) + sorted(self.dirs - {"/"})

    def children(self, d: str, files: dict | None = None, dirs: set | None = None) -> list[bytes]:
        files = self.files if files is None else files
        dirs = self.dirs if dirs is None else dirs
        names = [name_of(p) for p in list(files) + list(dirs) if p != "/" and parent_of(p) == d]
        return sorted(n.encode() for n in names)

    def links(self, path: str) -> int:
        """A file's link count in the model: the paths that share its bytearray (hard links)."""
        return sum(1 for b in self.files.values() if b is self.files[path])

    def nlink(self, d: str, dirs: set[str] | None = None) -> int:
        """A directory's link count in the model: 2 + its subdirectories."""
        dirs = self.dirs if dirs is None else dirs
        return 2 + sum(1 for p in dirs if p != "/" and parent_of(p) == d)

    def check_file(self, path: str) -> None:
        got = self.store.read_file(path)
        want = self.files[path]
        assert len(got) == len(want), f"{path}: size {len(got)}, model {len(want)}"
        assert got == want, f"{path}: content differs from the model"
        ino = self.ino(path)
        assert self.store.listxattr(ino) == sorted(want.xattrs), f"{path}: xattr names differ from the model"
        for name, value in want.xattrs.items():
            assert self.store.getxattr(ino, name) == value, f"{path}: xattr {name!r} differs"

    def check_all(self) -> None:
        for path in self.files:
            self.check_file(path)
        for name, snap in self.snaps.items():
            for path, want in snap.files.items():
                got = self.store.read_file(path, gen=snap.gen)
                assert got == want, f"snapshot {name} (gen {snap.gen}) {path}: differs from the model"
                nlink = self.store.resolve(path, snap.gen).nlink
                assert nlink == snap.nlinks[path], f"snapshot {name}: {path} has nlink {nlink}, model {snap.nlinks[path]}"
                ino = self.ino(path, snap.gen)
                got_x = {n: self.store.getxattr(ino, n, snap.gen) for n in self.store.listxattr(ino, snap.gen)}
                assert got_x == snap.xattrs[path], f"snapshot {name}: {path} xattrs differ from the model"
            for d in snap.dirs:
                names = [n for n, _ in self.store.readdir(self.ino(d, snap.gen), gen=snap.gen)]
                assert names == self.children(d, snap.files, snap.dirs), f"snapshot {name}: readdir {d}"
                want = self.nlink(d, snap.dirs)
                got = self.store.resolve(d, snap.gen).nlink
                assert got == want, f"snapshot {name}: {d} has nlink {got}, model {want}"
        assert sorted(s.name for s in self.store.snapshot_list()) == sorted(self.snaps)

    def draw_data(self, data: st.DataObject, limit: int) -> bytes:
        """Bytes to write: random, a repeated block, a copy of another file's bytes, zeros or tiny."""
        if limit <= 0:
            return b""
        kind = data.draw(st.sampled_from(["random", "repeat", "copy", "zeros", "tiny"]), label="kind")
        if kind == "tiny":
            return data.draw(st.binary(min_size=1, max_size=64), label="tiny")[:limit]
        if kind == "copy":
            sources = [p for p, b in sorted(self.files.items()) if b]
            if sources:
                src = self.files[data.draw(st.sampled_from(sources), label="copy of")]
                lo = data.draw(st.integers(0, len(src) - 1), label="from")
                n = data.draw(st.integers(1, len(src) - lo), label="n")
                return bytes(src[lo:lo + min(n, limit)])
            kind = "random"
        big = (128 * KiB, 768 * KiB)  # listed twice: half the writes span several chunks
        bucket = data.draw(st.sampled_from([(1, 8 * KiB), (8 * KiB, 128 * KiB), big, big]), label="size range")
        n = data.draw(st.integers(*bucket), label="n")
        seed = data.draw(st.integers(0, 2**32 - 1), label="seed")
        rnd = random.Random(seed)
        if kind == "repeat":
            block = rnd.randbytes(data.draw(st.integers(64 * KiB, 256 * KiB), label="block"))
            reps = data.draw(st.integers(2, 6), label="reps")
            out = block * reps
        elif kind == "zeros":
            out = bytes(n)
        else:
            out = rnd.randbytes(n)
        return out[:limit]

    def draw_offset(self, data: st.DataObject, size: int) -> int:
        return data.draw(st.one_of(
            st.just(size),                                   # append
            st.integers(0, max(size, 0)),                    # overwrite / inside
            st.integers(size, max(size, min(size + 512 * KiB, MAX_FILE - 1))),  # beyond EOF: a gap of zeros
        ), label="offset")

    def draw_size(self, data: st.DataObject, size: int) -> int:
        return data.draw(st.one_of(
            st.integers(0, size),                            # shrink
            st.integers(size, max(size, min(size + 768 * KiB, MAX_FILE))),  # grow
            st.just(0),
        ), label="new size")

    def pick(self, data: st.DataObject, items, label: str):  # type: ignore[no-untyped-def]
        return data.draw(st.sampled_from(sorted(items)), label=label)

    # -- setup ------------------------------------------------------------------------

    @initialize(batch=st.sampled_from([8 << 20, 96 << 10, 300 << 10]), reorder=st.sampled_from([64 << 20, 200 << 10]),
                hole=st.sampled_from([64 << 10, 0, 1 << 20]))
    def start(self, batch: int, reorder: int, hole: int) -> None:
        # A small session BATCH makes the streaming fast path hand several batches to the
        # chunking workers (and commit re-chunk in several pieces) even for ~2 MiB files; a
        # small REORDER window overflows with out-of-order appends of such files, and the
        # stream then steps over gaps up to HOLE wide (their bytes come later as patches).
        session_mod.BATCH = batch
        session_mod.REORDER = reorder
        session_mod.HOLE = hole
        # something to write to from the first step on
        for name in FILE_NAMES[:2]:
            self.store.create(ROOT_INO, name.encode())
            self.files["/" + name] = Body()

    # -- namespace ----------------------------------------------------------------------

    @rule(data=st.data())
    def create_file(self, data: st.DataObject) -> None:
        parent = self.pick(data, self.dirs, "parent")
        name = data.draw(st.sampled_from(FILE_NAMES + DIR_NAMES[:1]), label="name")
        path = join(parent, name)
        if path in self.files or path in self.dirs:
            try:
                self.store.create(self.ino(parent), name.encode())
                raise AssertionError(f"create {path}: expected Exists")
            except Exists:
                return
        attr = self.store.create(self.ino(parent), name.encode())
        assert attr.is_file and attr.size == 0
        self.files[path] = Body()
        self.check_file(path)

    @rule(data=st.data())
    def mkdir(self, data: st.DataObject) -> None:
        parent = self.pick(data, [d for d in self.dirs if d.count("/") < 2 or d == "/"], "parent")
        name = data.draw(st.sampled_from(DIR_NAMES + FILE_NAMES[:1]), label="name")
        path = join(parent, name)
        if path in self.files or path in self.dirs:
            try:
                self.store.mkdir(self.ino(parent), name.encode())
                raise AssertionError(f"mkdir {path}: expected Exists")
            except Exists:
                return
        attr = self.store.mkdir(self.ino(parent), name.encode())
        assert attr.is_dir
        self.dirs.add(path)

    @precondition(lambda self: self.files or len(self.dirs) > 1)
    @rule(data=st.data())
    def unlink(self, data: st.DataObject) -> None:
        path = self.pick(data, self.entries(), "path")
        parent, name = self.ino(parent_of(path)), name_of(path).encode()
        if path in self.dirs:
            try:
                self.store.unlink(parent, name)
                raise AssertionError(f"unlink {path}: expected IsADirectory")
            except IsADirectory:
                return
        self.store.unlink(parent, name)
        del self.files[path]
        try:
            self.store.resolve(path)
            raise AssertionError(f"{path} still resolves after unlink")
        except NotFound:
            pass

    @precondition(lambda self: self.files)
    @rule(data=st.data())
    def link(self, data: st.DataObject) -> None:
        src = self.pick(data, self.entries(), "link to")
        parent = self.pick(data, self.dirs, "parent")
        path = join(parent, data.draw(st.sampled_from(FILE_NAMES), label="name"))
        expect: type[Exception] | None = NotPermitted if src in self.dirs else None
        if expect is None and (path in self.files or path in self.dirs):
            expect = Exists
        call = lambda: self.store.link(self.ino(src), self.ino(parent), name_of(path).encode())  # noqa: E731
        if expect is not None:
            try:
                call()
                raise AssertionError(f"link {src} -> {path}: expected {expect.__name__}")
            except expect:
                return
        attr = call()
        self.files[path] = self.files[src]  # one inode, two names: the same bytearray
        assert attr.nlink == self.links(src) and self.ino(path) == self.ino(src)
        self.check_file(path)

    @precondition(lambda self: self.files)
    @rule(data=st.data(), name=st.sampled_from([b"user.a", b"user.b", b"trusted.t"]), remove=st.booleans())
    def xattr(self, data: st.DataObject, name: bytes, remove: bool) -> None:
        """setxattr / removexattr: on the inode, so every hard link sees it; kept by new bodies."""
        path = self.pick(data, self.files, "file")
        body = self.files[path]
        if remove:
            try:
                self.store.removexattr(self.ino(path), name)
                assert name in body.xattrs, f"removexattr {path} {name!r}: expected NoAttribute"
                del body.xattrs[name]
            except NoAttribute:
                assert name not in body.xattrs, f"removexattr {path} {name!r}: it was there"
        else:
            value = data.draw(st.binary(max_size=300), label="value")
            self.store.setxattr(self.ino(path), name, value)
            body.xattrs[name] = value
        self.check_file(path)

    @precondition(lambda self: self.files or len(self.dirs) > 1)
    @rule(data=st.data())
    def rmdir(self, data: st.DataObject) -> None:
        path = self.pick(data, self.entries(), "path")
        parent, name = self.ino(parent_of(path)), name_of(path).encode()
        if path in self.files:
            expect: type[Exception] | None = NotADirectory
        elif self.children(path):
            expect = NotEmpty
        else:
            expect = None
        if expect is not None:
            try:
                self.store.rmdir(parent, name)
                raise AssertionError(f"rmdir {path}: expected {expect.__name__}")
            except expect:
                return
        self.store.rmdir(parent, name)
        self.dirs.discard(path)

    @precondition(lambda self: self.files or len(self.dirs) > 1)
    @rule(data=st.data(), noreplace=st.booleans())
    def rename(self, data: st.DataObject, noreplace: bool) -> None:
        src = self.pick(data, self.entries(), "src")
        dst_parent = self.pick(data, self.dirs, "dst parent")
        dst = join(dst_parent, data.draw(st.sampled_from(FILE_NAMES + DIR_NAMES), label="dst name"))
        src_is_dir = src in self.dirs
        dst_exists = dst in self.files or dst in self.dirs
        expect: type[Exception] | None = None
        if src_is_dir and is_under(dst_parent, src):
            expect = InvalidArgument
        elif dst == src or (src in self.files and dst in self.files and self.files[src] is self.files[dst]):
            expect = None  # a name, or two names of one inode: nothing changes
        elif dst_exists and noreplace:
            expect = Exists
        elif dst_exists and src_is_dir and dst in self.files:
            expect = NotADirectory
        elif dst_exists and not src_is_dir and dst in self.dirs:
            expect = IsADirectory
        elif dst in self.dirs and self.children(dst):
            expect = NotEmpty
        call = lambda: self.store.rename(  # noqa: E731
            self.ino(parent_of(src)), name_of(src).encode(), self.ino(dst_parent), name_of(dst).encode(), noreplace=noreplace
        )
        if expect is not None:
            try:
                call()
                raise AssertionError(f"rename {src} -> {dst} (noreplace={noreplace}): expected {expect.__name__}")
            except expect:
                return
        call()
        if dst == src or (src in self.files and dst in self.files and self.files[src] is self.files[dst]):
            return
        # the replaced target (a file or an empty directory) disappears
        self.files.pop(dst, None)
        self.dirs.discard(dst)
        moved_files = {p: b for p, b in self.files.items() if is_under(p, src)}
        moved_dirs = {d for d in self.dirs if is_under(d, src)}
        for p in moved_files:
            del self.files[p]
        self.dirs -= moved_dirs
        for p, b in moved_files.items():
            self.files[dst + p[len(src):]] = b
        for d in moved_dirs:
            self.dirs.add(dst + d[len(src):])
        for p in moved_files:
            self.check_file(dst + p[len(src):])

    # -- file data ----------------------------------------------------------------------

    # three rules run write sessions, so data changes dominate the steps
    @precondition(lambda self: self.files)
    @rule(data=st.data())
    def write_session(self, data: st.DataObject) -> None:
        self._write_session(data)

    @precondition(lambda self: self.files)
    @rule(data=st.data())
    def write_session_again(self, data: st.DataObject) -> None:
        self._write_session(data)

    @precondition(lambda self: self.files)
    @rule(data=st.data())
    def write_session_more(self, data: st.DataObject) -> None:
        self._write_session(data)

    def _write_session(self, data: st.DataObject) -> None:
        """One write session: sequential appends from 0 (fast path), then random-offset
        writes, truncates, reads, intermediate commits; ends in commit, abort or close."""
        path = self.pick(data, self.files, "file")
        ino = self.ino(path)
        model = self.files[path]  # changed in place: every hard link of the file shares it
        committed = bytearray(model)
        view = bytearray(committed)  # the session's pending state
        with self.store.open_session(ino) as s:
            assert s.size == len(view)
            pos = 0
            appends: list[tuple[int, bytes]] = []
            for _ in range(data.draw(st.integers(0, 4), label="appends")):
                chunk = self.draw_data(data, MAX_FILE - pos)
                if not chunk:
                    break
                appends.append((pos, chunk))
                pos += len(chunk)
            # as the kernel's writeback may send them: a little out of order (the reorder window)
            for off, chunk in data.draw(st.permutations(appends), label="append order"):
                s.write(off, chunk)
                put(view, off, chunk)
            ops = data.draw(st.lists(st.sampled_from(["write", "write", "resend", "truncate", "setattr", "read", "commit"]),
                                     max_size=5), label="ops")
            for op in ops:
                if op == "resend":  # the writeback cache sends a page again: bytes the file has, then maybe new ones
                    off = data.draw(st.integers(max(0, len(view) - 80 * KiB), len(view)), label="resend at")
                    chunk = bytes(view[off:]) + self.draw_data(data, MAX_FILE - len(view))
                    if chunk:
                        assert s.write(off, chunk) == len(chunk)
                        put(view, off, chunk)
                elif op == "write":
                    off = self.draw_offset(data, len(view))
                    chunk = self.draw_data(data, MAX_FILE - off)
                    if chunk:
                        assert s.write(off, chunk) == len(chunk)
                        put(view, off, chunk)
                elif op == "truncate":
                    n = self.draw_size(data, len(view))
                    s.truncate(n)
                    resize(view, n)
                elif op == "setattr":  # truncate through the store while the session is open
                    n = self.draw_size(data, len(view))
                    assert self.store.setattr(ino, size=n).size == n
                    resize(view, n)
                elif op == "read":
                    off = data.draw(st.integers(0, len(view) + 10), label="read at")
                    n = data.draw(st.integers(0, 600 * KiB), label="read n")
                    assert s.read(off, n) == view[off:off + n], f"{path}: session read ({off}, {n}) differs"
                else:
                    s.commit()
                    committed = bytearray(view)
                    model[:] = committed
                    self.check_file(path)
                assert s.size == len(view)
            assert s.read(0, len(view) + 1) == view, f"{path}: session view differs from the model"
            end = data.draw(st.sampled_from(["commit", "commit", "commit", "abort", "close"]), label="end")
            note(f"session on {path}: appends to {pos}, ops {ops}, end {end}")
            if end == "commit":
                s.commit()
                model[:] = view
            elif end == "abort":
                s.abort()  # back at the last committed version; the session stays usable
                assert s.size == len(committed), f"{path}: session size {s.size} after abort"
                assert s.read(0, len(committed) + 1) == committed, f"{path}: session view after abort"
                if data.draw(st.booleans(), label="write after abort"):
                    off = self.draw_offset(data, len(committed))
                    chunk = self.draw_data(data, MAX_FILE - off)
                    s.write(off, chunk)
                    s.commit()
                    put(committed, off, chunk)
                    model[:] = committed
        self.check_file(path)  # an aborted or closed session's writes vanish

    @precondition(lambda self: self.files)
    @rule(data=st.data(), commit_first=st.booleans(), replace=st.booleans())
    def session_outlives_its_file(self, data: st.DataObject, commit_first: bool, replace: bool) -> None:
        """The file under an open session is unlinked (or renamed over); expire_history + gc
        must not take the session's view away; its commit then stores nothing (None)."""
        single = [p for p in self.files if self.links(p) == 1]  # unlinking it removes the inode
        if not single:
            return
        path = self.pick(data, single, "file")
        others = sorted(set(self.files) - {path})
        view = bytearray(self.files[path])
        with self.store.open_session(self.ino(path)) as s:
            off = self.draw_offset(data, len(view))
            chunk = self.draw_data(data, MAX_FILE - off)
            s.write(off, chunk)
            put(view, off, chunk)
            if commit_first:  # the session's base becomes the body it just committed
                s.commit()
            if replace and others:
                other = self.pick(data, others, "renamed over it")
                self.store.rename(self.ino(parent_of(other)), name_of(other).encode(), self.ino(parent_of(path)), name_of(path).encode())
                self.files[path] = self.files.pop(other)
            else:
                self.store.unlink(self.ino(parent_of(path)), name_of(path).encode())
                del self.files[path]
            self.store.expire_history()
            self.store.gc()
            assert s.read(0, len(view) + 1) == view, "session view lost after its file was removed and gc ran"
            off = self.draw_offset(data, len(view))
            chunk = self.draw_data(data, MAX_FILE - off)
            s.write(off, chunk)
            put(view, off, chunk)
            assert s.commit() is None, "commit of a removed file should store nothing"
            self.store.gc()
            assert s.read(0, len(view) + 1) == view, "session view lost after a commit of its removed file"
        if path in self.files:
            self.check_file(path)

    @precondition(lambda self: self.files)
    @rule(data=st.data())
    def truncate(self, data: st.DataObject) -> None:
        path = self.pick(data, self.files, "file")
        n = self.draw_size(data, len(self.files[path]))
        attr = self.store.setattr(self.ino(path), size=n)
        assert attr.size == n
        resize(self.files[path], n)
        self.check_file(path)

    # -- snapshots, history, gc, reopen ------------------------------------------------------

    @rule(name=st.sampled_from(SNAP_NAMES))
    def snapshot_create(self, name: str) -> None:
        if name in self.snaps:
            try:
                self.store.snapshot_create(name)
                raise AssertionError(f"snapshot {name}: expected Exists")
            except Exists:
                return
        snap = self.store.snapshot_create(name)
        self.snaps[name] = Snap(snap.gen, self.files, self.dirs)

    @precondition(lambda self: self.snaps)
    @rule(data=st.data())
    def snapshot_delete(self, data: st.DataObject) -> None:
        name = self.pick(data, self.snaps, "snapshot")
        self.store.snapshot_delete(name)
        del self.snaps[name]

    @rule(data=st.data(), action=st.sampled_from(["expire+gc", "gc", "reopen", "read snapshot"]))
    def maintenance(self, data: st.DataObject, action: str) -> None:
        """Rarer whole-store operations, one rule so they do not crowd out the data steps."""
        if action == "read snapshot":
            if self.snaps:
                snap = self.snaps[self.pick(data, self.snaps, "snapshot")]
                for path, want in snap.files.items():
                    assert self.store.read_file(path, gen=snap.gen) == want, f"snapshot gen {snap.gen} {path} differs"
            return
        if action == "expire+gc":
            self.store.expire_history()
            self.store.gc()
        elif action == "gc":
            self.store.gc()
        else:
            self.store.close()
            self.store = Store.open(self.path)
        self.check_all()

    # -- invariants and teardown ----------------------------------------------------------

    @invariant()
    def tree_matches(self) -> None:
        for d in self.dirs:
            listing = self.store.readdir(self.ino(d))
            assert [n for n, _ in listing] == self.children(d), f"readdir {d}"
            for n, attr in listing:
                p = join(d, n.decode())
                if p in self.files:
                    assert attr.is_file and attr.size == len(self.files[p]), f"{p}: stat size {attr.size}"
                    assert attr.nlink == self.links(p), f"{p}: nlink {attr.nlink}, model {self.links(p)}"
                else:
                    assert attr.is_dir, f"{p}: expected a directory"
                    assert attr.nlink == self.nlink(p), f"{p}: nlink {attr.nlink}, model {self.nlink(p)}"
        assert self.store.getattr(ROOT_INO).nlink == self.nlink("/")

    def teardown(self) -> None:
        session_mod.BATCH, session_mod.REORDER, session_mod.HOLE = self._batch, self._reorder, self._hole
        try:
            if not self.store.closed:
                try:
                    self.check_all()
                finally:
                    self.store.close()
            with Store.open(self.path) as store:
                report = store.fsck()
            assert report.clean, "fsck found problems:\n" + "\n".join(p.line() for p in report.problems)
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)


StoreMachine.TestCase.settings = SETTINGS
TestStoreModel = StoreMachine.TestCase
