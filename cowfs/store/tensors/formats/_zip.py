"""A minimal, bounded zip reader: the end records, the central directory and local headers.

It reads an archive that ENDS at a given offset (the file end, or the start of the next
archive when archives are concatenated, as in a torch.distributed.checkpoint .distcp file)
and finds where the archive begins from its own end records. It never reads entry data.
Only what torch.save writes needs to work; anything unusual raises Malformed."""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Iterator

from ._base import Malformed, Reader

EOCD = struct.Struct("<4sHHHHIIH")                 # 22 bytes, signature PK\x05\x06
ZIP64_LOCATOR = struct.Struct("<4sIQI")            # 20 bytes, signature PK\x06\x07
ZIP64_EOCD = struct.Struct("<4sQHHIIQQQQ")         # 56 bytes, signature PK\x06\x06
CENTRAL = struct.Struct("<4sHHHHHHIIIHHHHHII")     # 46 bytes, signature PK\x01\x02
LOCAL = struct.Struct("<4sHHHHHIIIHH")             # 30 bytes, signature PK\x03\x04
MAX_CENTRAL = 64 << 20
MAX_COMMENT_SCAN = 0xFFFF + EOCD.size
U32 = 0xFFFFFFFF


@dataclass(frozen=True)
class Entry:
    name: str
    method: int            # 0 = stored
    flags: int
    size: int              # uncompressed
    comp_size: int
    header: int            # absolute offset of the local header
    data: int = -1         # absolute offset of the entry's bytes (set by `locate`)


@dataclass(frozen=True)
class Archive:
    base: int              # absolute offset of the archive's first byte
    end: int               # absolute offset just past its end of central directory record
    cd_start: int
    entries: dict[str, Entry]


def _eocd_position(read: Reader, lo: int, end: int) -> int:
    """Offset of the end-of-central-directory record whose comment ends exactly at `end`."""
    if end - lo < EOCD.size:
        raise Malformed("zip: too short")
    if read(end - EOCD.size, 4) == b"PK\x05\x06" and read(end - 2, 2) == b"\0\0":
        return end - EOCD.size
    span = min(end - lo, MAX_COMMENT_SCAN)
    tail = read(end - span, span)
    pos = tail.rfind(b"PK\x05\x06")
    while pos >= 0:
        if pos + EOCD.size <= span:
            (comment_len,) = struct.unpack_from("<H", tail, pos + 20)
            if pos + EOCD.size + comment_len == span:
                return end - span + pos
        pos = tail.rfind(b"PK\x05\x06", 0, pos)
    raise Malformed("zip: no end of central directory record")


def read_archive(read: Reader, end: int, lo: int = 0) -> Archive:
    """The archive whose last byte is at end - 1 and which begins at or after `lo`."""
    eocd_pos = _eocd_position(read, lo, end)
    (_, disk, cd_disk, n_disk, n_total, cd_size, cd_off, _) = EOCD.unpack(read(eocd_pos, 22))
    cd_end = eocd_pos
    loc_pos = eocd_pos - ZIP64_LOCATOR.size
    if loc_pos >= lo and read(loc_pos, 4) == b"PK\x06\x07":
        z64_pos = loc_pos - ZIP64_EOCD.size
        if z64_pos < lo:
            raise Malformed("zip64: truncated")
        rec = ZIP64_EOCD.unpack(read(z64_pos, ZIP64_EOCD.size))
        if rec[0] != b"PK\x06\x06" or rec[1] != ZIP64_EOCD.size - 12:
            raise Malformed("zip64: bad end record")
        disk, cd_disk, n_disk, n_total, cd_size, cd_off = rec[4:10]
        _, _, z64_rel, _ = ZIP64_LOCATOR.unpack(read(loc_pos, ZIP64_LOCATOR.size))
        cd_end = z64_pos
        if z64_rel != cd_off + cd_size:
            raise Malformed("zip64: locator disagrees with the central directory")
    if disk or cd_disk or n_disk != n_total:
        raise Malformed("zip: multi-disk archive")
    if cd_size > MAX_CENTRAL or n_total > cd_size // CENTRAL.size:
        raise Malformed("zip: central directory too large or too small")
    cd_start = cd_end - cd_size
    base = cd_start - cd_off
    if base < lo or cd_start < base:
        raise Malformed("zip: central directory outside the archive")
    entries = _central(read(cd_start, cd_size), n_total, base, cd_start)
    return Archive(base, end, cd_start, entries)


def _central(cd: bytes, count: int, base: int, cd_start: int) -> dict[str, Entry]:
    entries: dict[str, Entry] = {}
    pos = 0
    for _ in range(count):
        f = CENTRAL.unpack_from(cd, pos)
        if f[0] != b"PK\x01\x02":
            raise Malformed("zip: bad central directory entry")
        flags, method = f[3], f[4]
        comp, size, name_len, extra_len, comment_len = f[8], f[9], f[10], f[11], f[12]
        disk, header = f[13], f[16]
        p = pos + CENTRAL.size
        name_raw = cd[p:p + name_len]
        extra = cd[p + name_len:p + name_len + extra_len]
        pos = p + name_len + extra_len + comment_len
        if pos > len(cd) or len(name_raw) != name_len:
            raise Malformed("zip: central directory entry runs past its end")
        size, comp, header, disk = _zip64_extra(extra, size, comp, header, disk)
        name = name_raw.decode("utf-8" if flags & 0x800 else "cp437")
        if disk or name in entries or base + header >= cd_start:
            raise Malformed("zip: bad or duplicate entry")
        entries[name] = Entry(name, method, flags, size, comp, base + header)
    if pos != len(cd):
        raise Malformed("zip: central directory size mismatch")
    return entries


ZIP64_EXTRA = 0x0001  # the zip64 extended-information field's id


def extra_fields(extra: bytes) -> Iterator[tuple[int, bytes]]:
    """(id, body) of each field of a header's extra field."""
    pos = 0
    while pos + 4 <= len(extra):
        tag, length = struct.unpack_from("<HH", extra, pos)
        yield tag, extra[pos + 4:pos + 4 + length]
        pos += 4 + length


def _zip64_extra(extra: bytes, size: int, comp: int, header: int,
                 disk: int) -> tuple[int, int, int, int]:
    """Apply a zip64 extended-information field (id 1): each value that is 0xFFFFFFFF
    (0xFFFF for the disk) in the fixed fields comes next, as u64 (u32 for the disk)."""
    for tag, body in extra_fields(extra):
        if tag != ZIP64_EXTRA:
            continue
        q = 0
        vals = [size, comp, header]
        for i in range(3):
            if vals[i] == U32:
                if q + 8 > len(body):
                    raise Malformed("zip64: short extra field")
                (vals[i],) = struct.unpack_from("<Q", body, q)
                q += 8
        if disk == 0xFFFF:
            if q + 4 > len(body):
                raise Malformed("zip64: short extra field")
            (disk,) = struct.unpack_from("<I", body, q)
        return vals[0], vals[1], vals[2], disk
    return size, comp, header, disk


def locate(read: Reader, archive: Archive, entry: Entry) -> Entry:
    """`entry` with `data` set: local header offset + 30 + name length + extra length.
    Refuses encrypted entries and data that would run into the central directory."""
    name = entry.name.encode("utf-8" if entry.flags & 0x800 else "cp437")
    raw = read(entry.header, LOCAL.size + len(name))
    f = LOCAL.unpack_from(raw, 0)
    if f[0] != b"PK\x03\x04" or raw[LOCAL.size:] != name or f[9] != len(name):
        raise Malformed(f"zip: bad local header for {entry.name!r}")
    if entry.flags & 1:
        raise Malformed("zip: encrypted entry")
    data = entry.header + LOCAL.size + f[9] + f[10]
    if data + entry.comp_size > archive.cd_start:
        raise Malformed(f"zip: {entry.name!r} runs into the central directory")
    return Entry(entry.name, entry.method, entry.flags, entry.size, entry.comp_size,
                 entry.header, data)
