"""Chunks read back from the bucket by their id: a ranged GET of the record, checked like a
read from the log (header, id, length, payload CRC, BLAKE3 of the decoded bytes), delta
bases fetched the same way. A missing or damaged object raises CorruptData (EIO)."""
from __future__ import annotations

from ..errors import CorruptData, RemoteError
from ..store.log.codecs import decode
from ..store.log.layout import MAX_CHAIN
from ..store.log.log import check_chunk
from ..store.log.records import RecordError, check_record
from .packs import PackEntry
from .s3 import Bucket, MissingObject
from .state import RemoteState


class RemoteChunks:
    def __init__(self, bucket: Bucket, state: RemoteState) -> None:
        self.bucket = bucket
        self.state = state

    def record(self, chunk_id: bytes) -> tuple[PackEntry, memoryview]:
        """The chunk's entry and its record's payload as stored (checked against its CRC),
        from the first pack holding it that reads back (a pack may be missing or damaged
        while another copy of the chunk is intact)."""
        found = self.state.locations(chunk_id)
        if not found:
            raise CorruptData(f"chunk {chunk_id.hex()[:16]}: in no pack of {self.bucket.cfg.url}")
        errors: list[CorruptData] = []
        for pack, entry in found:
            try:
                return entry, self._payload(chunk_id, pack, entry)
            except CorruptData as e:
                errors.append(e)
        raise errors[0]

    def _payload(self, chunk_id: bytes, pack: str, entry: PackEntry) -> memoryview:
        key = self.bucket.key("packs", pack)
        where = f"chunk {chunk_id.hex()[:16]} in {key} at offset {entry.offset}"
        try:
            data = memoryview(self.bucket.get_range(key, entry.offset, entry.span))
        except MissingObject:
            raise CorruptData(f"{where}: the pack is missing from the bucket") from None
        except RemoteError as e:
            raise CorruptData(f"{where}: {e}") from None
        try:
            _, payload = check_record(data, chunk_id, entry.stored_len)
        except RecordError as e:
            raise CorruptData(f"{where}: {e}") from None
        return payload

    def read(self, chunk_id: bytes, depth: int = 1) -> bytes | memoryview:
        """The chunk's raw bytes, verified against its id."""
        entry, payload = self.record(chunk_id)

        def base_raw(base_id: bytes) -> bytes | memoryview:
            if depth >= MAX_CHAIN:
                raise CorruptData(f"chunk {chunk_id.hex()[:16]}: delta chain longer than {MAX_CHAIN} records")
            return self.read(base_id, depth + 1)

        raw = decode(entry.codec, payload, entry.raw_len, base_raw)
        check_chunk(chunk_id, raw)
        return raw
