"""Doomed lists, `PREFIX/gc/NAME.doomed`: the packs a `cowfs remote gc` found no retained
catalog of any store using (the mark), which a later gc deletes once the list is older than
its grace period, if they are still unused then (the sweep). Every upload pass reads them
and counts the chunks of doomed packs as not in the bucket.

docs/format.md (section 9.9) has the bytes, docs/design.md (section 17, "Remote gc") the
protocol and why it never deletes a pack a retained catalog needs.
"""
from __future__ import annotations

import logging
import struct
import uuid
import zlib
from dataclasses import dataclass

from ..errors import CorruptData
from .packs import is_pack_name, pack_name
from .s3 import Bucket, MissingObject
from .state import RemoteState

log = logging.getLogger("cowfs.remote")

MIN_GRACE = 2.0  # seconds: the shortest grace period a gc may use (passes rely on it)
CLOCK_STEP = 1.0  # LastModified and the Date header count whole seconds
SUFFIX = ".doomed"
DOOMED_MAGIC = b"CWFSDOOM"
DOOMED_VERSION = 1
DOOMED_HEAD = struct.Struct("<8s I I Q Q 16s")  # magic, version, count, grace (ms), created (ns), store uuid
DOOMED_ENTRY = struct.Struct("<32s Q Q")  # pack name, pack size, pack LastModified (ms; 0: no pack object)


@dataclass(frozen=True)
class DoomedPack:
    name: str
    size: int  # bytes of the pack object (0: it had none, only an index)
    modified_ms: int  # its LastModified when marked, ms since the epoch (0: no pack object)


@dataclass(frozen=True)
class DoomedList:
    name: str  # BLAKE3-256 of the object's bytes, hex
    grace_ms: int
    created_ns: int  # the marking machine's clock (for people; the engine's LastModified counts)
    store_uuid: str  # the store whose gc marked
    packs: list[DoomedPack]

    @property
    def grace(self) -> float:
        return self.grace_ms / 1000


def encode_doomed(grace: float, created_ns: int, store_uuid: str, packs: list[DoomedPack]) -> tuple[str, bytes]:
    """(name, bytes) of a doomed list; its key is gc/NAME.doomed."""
    parts = [DOOMED_HEAD.pack(DOOMED_MAGIC, DOOMED_VERSION, len(packs), round(grace * 1000), created_ns,
                              uuid.UUID(store_uuid).bytes)]
    parts += [DOOMED_ENTRY.pack(bytes.fromhex(p.name), p.size, p.modified_ms) for p in packs]
    body = b"".join(parts)
    data = body + struct.pack("<I", zlib.crc32(body))
    return pack_name(data), data


def decode_doomed(data: bytes, expect_name: str | None = None) -> DoomedList:
    if len(data) < DOOMED_HEAD.size + 4:
        raise CorruptData("doomed list truncated")
    (crc,) = struct.unpack_from("<I", data, len(data) - 4)
    if zlib.crc32(data[:-4]) != crc:
        raise CorruptData("doomed list checksum mismatch")
    magic, version, count, grace_ms, created_ns, raw_uuid = DOOMED_HEAD.unpack_from(data)
    if magic != DOOMED_MAGIC or version != DOOMED_VERSION:
        raise CorruptData("not a cowfs doomed list (version 1)")
    if len(data) != DOOMED_HEAD.size + count * DOOMED_ENTRY.size + 4:
        raise CorruptData("doomed list length does not match its count")
    name = pack_name(data)
    if expect_name is not None and name != expect_name:
        raise CorruptData(f"doomed list bytes hash to {name[:16]}, not to its name {expect_name[:16]}")
    packs = []
    for k in range(count):
        raw, size, modified = DOOMED_ENTRY.unpack_from(data, DOOMED_HEAD.size + k * DOOMED_ENTRY.size)
        packs.append(DoomedPack(raw.hex(), size, modified))
    return DoomedList(name, grace_ms, created_ns, str(uuid.UUID(bytes=raw_uuid)), packs)


def doomed_key(bucket: Bucket, name: str) -> str:
    return bucket.key("gc", name + SUFFIX)


@dataclass(frozen=True)
class ListedDoomed:
    key: str
    name: str
    modified: float  # its LastModified: when it was marked, on the engine's clock
    doomed: DoomedList | None  # None: damaged; names nothing (no sweep deletes a pack by it)
    error: str = ""

    def due(self, now: float) -> bool:
        """Older than its grace period at engine time `now`, whole seconds allowed for."""
        return self.doomed is not None and now - self.modified >= self.doomed.grace + CLOCK_STEP


def list_doomed(bucket: Bucket, read: bool = True) -> list[ListedDoomed]:
    """The doomed lists in gc/, oldest first; with `read`, each fetched and decoded."""
    prefix = bucket.key("gc", "")
    out: list[ListedDoomed] = []
    for obj in bucket.list(prefix):
        stem = obj.key[len(prefix):]
        if not stem.endswith(SUFFIX) or not is_pack_name(stem[:-len(SUFFIX)]):
            continue
        name = stem[:-len(SUFFIX)]
        doomed, error = None, ""
        if read:
            try:
                doomed = decode_doomed(bucket.get(obj.key), expect_name=name)
            except CorruptData as e:
                error = str(e)
            except MissingObject:  # swept since the listing
                continue
        out.append(ListedDoomed(obj.key, name, obj.modified, doomed, error))
    return sorted(out, key=lambda d: (d.modified, d.name))


def look_at_gc(bucket: Bucket, state: RemoteState) -> tuple[set[str], set[str]]:
    """Note in remote.db which packs the doomed lists in gc/ name now (a list already read is
    not fetched again: it is immutable). Returns the lists noted before and gone now (swept:
    the packs they named may be deleted), and the lists new since the last look (their packs
    are doomed from now on). A damaged list is left out with a warning: no sweep deletes
    anything by it either."""
    known = state.doomed_lists()
    lists: dict[str, list[str]] = {}
    for d in list_doomed(bucket, read=False):
        if d.name in known:
            lists[d.name] = state.packs_of_list(d.name)
            continue
        try:
            lists[d.name] = [p.name for p in decode_doomed(bucket.get(d.key), expect_name=d.name).packs]
        except CorruptData as e:
            log.warning("%s ignored: %s", d.key, e)
        except MissingObject:  # swept since the listing
            pass
    state.set_doomed(lists)
    return known - set(lists), set(lists) - known
