import pytest

from cowfs.store.data.chunking import chunk_id
from cowfs.store.log.records import (
    DATA_START,
    RECORD_ALIGN,
    RecordError,
    decode_record_header,
    decode_segment_header,
    encode_record,
    encode_segment_header,
    scan_records,
)

UUID = "12345678-1234-5678-1234-567812345678"


def test_segment_header_roundtrip_and_checksum():
    raw = encode_segment_header(7, UUID, 123, 1)
    h = decode_segment_header(raw)
    assert (h.seg_id, h.store_uuid, h.created_ns, h.version) == (7, UUID, 123, 1)
    bad = bytearray(raw)
    bad[20] ^= 1
    with pytest.raises(RecordError):
        decode_segment_header(bytes(bad))


def test_record_roundtrip_padding_and_header_checksum():
    payload = b"hello world" * 100
    rec = encode_record(chunk_id(payload), payload, len(payload))
    assert len(rec) % RECORD_ALIGN == 0
    head = decode_record_header(rec[:64])
    assert head.chunk_id == chunk_id(payload) and head.stored_len == len(payload)
    for i in (0, 5, 9, 30, 62):
        bad = bytearray(rec)
        bad[i] ^= 0x40
        with pytest.raises(RecordError):
            decode_record_header(bytes(bad[:64]))


def _segment(*payloads: bytes, gap: int = 0) -> bytearray:
    img = bytearray(DATA_START)
    img[:64] = encode_segment_header(1, UUID, 0, 1)
    for p in payloads:
        img += encode_record(chunk_id(p), p, len(p))
        img += bytes(gap)
    img += bytes(8192)
    return img


def test_scan_finds_records_and_skips_zeros():
    ps = [b"a" * 1000, b"b" * 70000, b"c" * 5]
    recs = list(scan_records(bytes(_segment(*ps, gap=4096))))
    assert [r.header.stored_len for r in recs] == [1000, 70000, 5]
    assert all(r.payload_ok for r in recs)


def test_scan_reports_damage_and_resynchronises():
    ps = [b"a" * 1000, b"b" * 3000, b"c" * 500]
    img = _segment(*ps)
    second = DATA_START + ((64 + 1000 + 63) // 64) * 64
    img[second + 100] ^= 0xFF  # payload of the second record
    recs = list(scan_records(bytes(img)))
    assert [r.payload_ok for r in recs] == [True, False, True]
    img[second] = 0x00  # destroy the second header's magic
    recs = list(scan_records(bytes(img)))
    damaged = [r for r in recs if r.header is None]
    assert len(damaged) == 1 and damaged[0].offset == second
    assert [r.header.stored_len for r in recs if r.header] == [1000, 500]


def test_check_record_names_what_is_wrong():
    from cowfs.store.log.records import RecordError, check_record, record_parts

    cid, payload = b"\x01" * 32, b"payload bytes"
    rec = b"".join(bytes(p) for p in record_parts(cid, payload, len(payload), 0))
    head, got = check_record(rec, cid, len(payload))
    assert bytes(got) == payload and head.chunk_id == cid
    with pytest.raises(RecordError, match="expected chunk"):
        check_record(rec, b"\x02" * 32)
    with pytest.raises(RecordError, match="expected chunk"):
        check_record(rec, cid, len(payload) + 1)
    bad = bytearray(rec)
    bad[64] ^= 1
    with pytest.raises(RecordError, match="checksum"):
        check_record(bytes(bad))
    with pytest.raises(RecordError, match="truncated"):
        check_record(rec[:70])
