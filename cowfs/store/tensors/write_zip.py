"""torch.save archives walked as they are written (and .distcp files: such archives back to back).

torch writes each zip entry as a local header with flag 0x08 (its CRC and sizes follow the
data), the entry's bytes (64-byte aligned by the header's extra field), then a data
descriptor: PK\\x07\\x08, CRC-32, compressed and uncompressed size (4 bytes each; 8 when the
local header carries a zip64 extra field). So an entry's end is not in its header. But the
first entry, PREFIX/data.pkl, is the pickle that names every storage with its dtype and
element count (formats/torchzip.py): the size of each PREFIX/data/KEY entry is known before
its bytes come.

`ZipWalk.advance` reads the local headers, descriptors and end records in order, as far as
the bytes it is given reach. Where the next one is not whole in them it returns that offset
as a hold: the chunker cuts nothing at or after it in this batch, so the next batch begins
with it. A record whose size the pickle does not give (`version`, `byteorder`, ...) ends at
the first descriptor that says so, within MAX_SMALL bytes. After an archive's end of central
directory record another archive may begin (a .distcp file). The walk ends at the first
thing it does not expect: a wrong guess only costs dedup, never a byte.
"""
from __future__ import annotations

import struct
from typing import Callable

from .formats import _pickle, torchzip
from .formats._base import ELEM_SIZE, TensorRegion
from .formats._zip import CENTRAL, EOCD, LOCAL, ZIP64_EOCD, ZIP64_EXTRA, ZIP64_LOCATOR, extra_fields

ReadFn = Callable[[int, int], bytes]  # (file offset, length) -> up to that many bytes there

LOCAL_SIG, DESCRIPTOR_SIG = b"PK\x03\x04", b"PK\x07\x08"
CENTRAL_SIG, ZIP64_END_SIG, ZIP64_LOCATOR_SIG, END_SIG = b"PK\x01\x02", b"PK\x06\x06", b"PK\x06\x07", b"PK\x05\x06"
MAX_SMALL = 64 << 10  # the longest record whose size the pickle does not give
FIRST_LOOK = 64 << 10  # bytes read first for a pickle (then all there are)
SMALL_LOOK = 4 << 10  # bytes searched first for a small record's descriptor (then MAX_SMALL)
MAX_WAIT = 16 << 20  # how far past a hold the walk waits for the record there (a data.pkl) before it gives up


class ZipWalk:
    """Where one stream of torch.save archives has got to: `pos`, and what is expected there."""

    def __init__(self) -> None:
        self.pos = 0
        self.state = "archive"  # archive | entry | descriptor | small | done
        self._expect = 0  # descriptor: the entry's size
        self._wide = False  # descriptor: zip64 sizes first
        self._sizes: dict[str, TensorRegion] = {}  # entry name -> its region (offset 0) from the pickle

    @staticmethod
    def begins(head: bytes) -> bool:
        """Whether a file starting with `head` starts as a torch.save archive does."""
        return head[:4] == LOCAL_SIG and len(head) >= LOCAL.size

    def advance(self, end: int, read: ReadFn, final: bool) -> tuple[list[TensorRegion], int | None]:
        """The storages' regions found before `end` (the bytes [self.pos, end) are readable),
        and the offset to hold at, if the next record is not whole before `end`. `final`:
        no more bytes will come."""
        found: list[TensorRegion] = []
        while self.state != "done" and self.pos < end:
            step = getattr(self, "_" + self.state)(end, read, found)
            if step == "hold":
                if final:
                    self.state = "done"
                    return found, None
                return found, self.pos
        return found, None

    # -- one record each; "hold" when it is not whole before `end` ------------------------

    def _local(self, end: int, read: ReadFn) -> tuple[str, int, bool, int | None] | str | None:
        """The local header at pos: (name, data offset, zip64 extra, the entry's size if the
        header gives it: no descriptor follows then), "hold", or None."""
        if self.pos + LOCAL.size > end:
            return "hold"
        sig, _ver, flags, method, _t, _d, _crc, comp, size, nlen, elen = LOCAL.unpack(read(self.pos, LOCAL.size))
        if sig != LOCAL_SIG or method != 0 or (not flags & 0x08 and comp != size):
            return None
        data = self.pos + LOCAL.size + nlen + elen
        if data > end:
            return "hold"
        name = read(self.pos + LOCAL.size, nlen).decode("utf-8", "replace")
        wide = _has_zip64(read(self.pos + LOCAL.size + nlen, elen))
        if flags & 0x08:
            return name, data, wide, None
        return None if wide else (name, data, wide, size)  # (sizes in a zip64 field: not what torch writes)

    def _archive(self, end: int, read: ReadFn, found: list[TensorRegion]) -> str | None:
        local = self._local(end, read)
        if local == "hold" or local is None:
            return self._stop(local)
        name, data, wide, size = local
        if not (name.endswith("/data.pkl") and name.count("/") == 1):
            return self._stop(None)
        try:
            root, used = _pickle_at(data, end, read)
            storages = torchzip.storages(root)
        except Exception:  # noqa: BLE001 - not whole yet (or malformed: then the wait is bounded)
            return self._stop("hold" if end - self.pos < MAX_WAIT else None)
        prefix = name[:-len("data.pkl")]
        self._sizes = {}
        for st in storages.values():
            nbytes = st.numel * ELEM_SIZE[st.kind] if st.kind in ELEM_SIZE else st.numel if st.kind == "untyped" else -1
            if nbytes > 0:
                try:
                    dtype, shape = torchzip.dtype_and_shape(st, nbytes)
                except Exception:  # noqa: BLE001 - the compactor would not piece it either
                    continue
                key = f"data/{st.key}"
                self._sizes[prefix + key] = TensorRegion(key, dtype, ELEM_SIZE[dtype], shape, 0, nbytes)
        self._after(data, used, wide, size)
        return None

    def _after(self, data: int, length: int, wide: bool, size: int | None) -> None:
        """An entry of `length` bytes at `data`: its descriptor next, or (its size in its
        header) the next record."""
        if size is None:
            self.pos, self._expect, self._wide, self.state = data + length, length, wide, "descriptor"
        elif size == length:
            self.pos, self.state = data + length, "entry"
        else:
            self.state = "done"

    def _entry(self, end: int, read: ReadFn, found: list[TensorRegion]) -> str | None:
        if self.pos + 4 > end:
            return "hold"
        sig = read(self.pos, 4)
        if sig in (CENTRAL_SIG, ZIP64_END_SIG, ZIP64_LOCATOR_SIG, END_SIG):
            return self._end_record(sig, end, read)
        local = self._local(end, read)
        if local == "hold" or local is None:
            return self._stop(local)
        name, data, wide, size = local
        template = self._sizes.pop(name, None)
        if template is None:
            if size is None:
                self.pos, self._wide, self.state = data, wide, "small"
            else:
                self._after(data, size, wide, size)
            return None
        found.append(TensorRegion(template.name, template.dtype, template.elem_size, template.shape, data,
                                  template.length))
        self._after(data, template.length, wide, size)
        return None

    def _descriptor(self, end: int, read: ReadFn, found: list[TensorRegion]) -> str | None:
        need = 24 if self._wide else 16
        if self.pos + need > end:
            return "hold"
        raw = read(self.pos, need)
        sizes = struct.unpack_from("<QQ" if self._wide else "<II", raw, 8)
        if raw[:4] != DESCRIPTOR_SIG or sizes != (self._expect, self._expect):
            return self._stop(None)
        self.pos, self.state = self.pos + need, "entry"
        return None

    def _small(self, end: int, read: ReadFn, found: list[TensorRegion]) -> str | None:
        """A record of unknown size at pos: it ends where a descriptor gives its own offset."""
        need, form = (24, "<QQ") if self._wide else (16, "<II")
        for look in (SMALL_LOOK, MAX_SMALL + need):  # such records are a few bytes: look near first
            span = read(self.pos, min(end - self.pos, look))
            at = span.find(DESCRIPTOR_SIG)
            while 0 <= at and at + need <= len(span):
                if struct.unpack_from(form, span, at + 8) == (at, at):
                    self.pos, self.state = self.pos + at + need, "entry"
                    return None
                at = span.find(DESCRIPTOR_SIG, at + 1)
            if len(span) < look:
                break
        return self._stop("hold" if len(span) < MAX_SMALL + need else None)

    def _end_record(self, sig: bytes, end: int, read: ReadFn) -> str | None:
        """Step over one record of an archive's end: a central directory entry, the zip64 end
        record and locator, the end of central directory (then another archive may begin)."""
        record = {CENTRAL_SIG: CENTRAL, ZIP64_END_SIG: ZIP64_EOCD, ZIP64_LOCATOR_SIG: ZIP64_LOCATOR, END_SIG: EOCD}[sig]
        if self.pos + record.size > end:
            return "hold"
        f = record.unpack(read(self.pos, record.size))
        if sig == CENTRAL_SIG:  # then its name, extra field and comment
            self.pos += record.size + f[10] + f[11] + f[12]
        elif sig == ZIP64_END_SIG:  # its size counts the bytes after its first 12
            self.pos += 12 + f[1]
        elif sig == ZIP64_LOCATOR_SIG:
            self.pos += record.size
        else:  # then its comment; another archive may follow
            self.pos += record.size + f[7]
            self.state = "archive"
        return None

    def _stop(self, why: str | None) -> str | None:
        """"hold" stays at pos; None (something unexpected) ends the walk."""
        if why is None:
            self.state = "done"
        return why


def _pickle_at(data: int, end: int, read: ReadFn) -> tuple[object, int]:
    """The pickle at `data` (its stand-in value and length), read from the bytes before `end`:
    the first FIRST_LOOK of them, then all (a .distcp file's archives hold one small pickle
    each: reading the rest of a batch for each would copy it once per archive)."""
    try:
        return _pickle.run_prefix(read(data, min(end - data, FIRST_LOOK)))
    except Exception:  # noqa: BLE001 - longer than the first look, or not whole, or malformed
        if end - data <= FIRST_LOOK:
            raise
    return _pickle.run_prefix(read(data, end - data))


def _has_zip64(extra: bytes) -> bool:
    """Whether a local header's extra field holds a zip64 block (then its descriptor's sizes
    are 8 bytes each)."""
    return any(tag == ZIP64_EXTRA for tag, _body in extra_fields(extra))
