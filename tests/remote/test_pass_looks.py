"""Which LISTs an upload pass makes (docs/design.md section 17, "Fewer looks per pass"),
against the real RGW, on a clock the test moves: `gc/` at the start and after the catalog's
PUT, before the PUT only when the start's look is not fresh; `index/` when due; `packs/` on
the tier's first pass, after a failed pass, when a known pack's index is gone, and when due."""
from __future__ import annotations

from collections import Counter

import pytest

from cowfs.errors import RemoteError
from cowfs.remote import upload
from cowfs.remote.bucket_look import ADOPT_EVERY, FRESH, INDEX_EVERY, Looks
from cowfs.remote.s3 import Bucket
from cowfs.remote.tier import tier_of
from tests.support.remoteutil import one_store, read_back
from tests.support.storeutil import assert_clean, data

pytestmark = pytest.mark.usefixtures("aws_env")  # the engine's keys in AWS_* (conftest.py)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def listed(monkeypatch):  # type: ignore[no-untyped-def]
    """Counts LISTs by the part of the bucket listed (gc, index, packs, ...)."""
    counts: Counter[str] = Counter()
    real = Bucket.list

    def counting(self, prefix):  # type: ignore[no-untyped-def]
        part = prefix[len(self.key("")):].split("/")[0]
        counts[part] += 1
        return real(self, prefix)

    monkeypatch.setattr(Bucket, "list", counting)
    return counts


def clocked_store(tmp_path, rgw, s3_bucket):  # type: ignore[no-untyped-def]
    """A store with a remote whose tier looks at the bucket on a clock the test moves."""
    s, cfg = one_store(tmp_path, rgw, s3_bucket)
    clock = Clock()
    tier_of(s).looks = Looks(clock=clock)
    return s, cfg, clock


def push_file(s, name: str, blob: bytes, listed: Counter[str]) -> dict[str, int]:  # type: ignore[no-untyped-def]
    """Write /run/NAME and push it; the LISTs the pass made."""
    s.write_file(f"/run/{name}", blob)
    listed.clear()
    tier_of(s).push()
    return {k: v for k, v in listed.items() if k in ("gc", "index", "packs")}


def test_a_pass_right_after_another_lists_gc_twice_and_nothing_else(tmp_path, rgw, s3_bucket, listed):
    s, cfg, clock = clocked_store(tmp_path, rgw, s3_bucket)
    with s:
        # the tier's first pass: everything at the start; the look before the PUT is fresh
        assert push_file(s, "a.bin", data(1 << 20, 1), listed) == {"gc": 2, "index": 1, "packs": 1}
        assert push_file(s, "b.bin", data(1 << 20, 2), listed) == {"gc": 2}
        clock.now += INDEX_EVERY
        assert push_file(s, "c.bin", data(1 << 20, 3), listed) == {"gc": 2, "index": 1}
        clock.now += ADOPT_EVERY
        assert push_file(s, "d.bin", data(1 << 20, 4), listed) == {"gc": 2, "index": 1, "packs": 1}
        assert read_back(cfg, s.config.store_uuid, tmp_path) == {f"/run/{n}.bin": data(1 << 20, k + 1)
                                                                for k, n in enumerate("abcd")}
    assert_clean(s.root)


def test_a_long_pass_looks_again_before_its_put(tmp_path, rgw, s3_bucket, listed, monkeypatch):
    s, cfg, clock = clocked_store(tmp_path, rgw, s3_bucket)
    with s:
        push_file(s, "a.bin", data(1 << 20, 1), listed)
        real = upload._upload_pack

        def slow(*a, **k):  # type: ignore[no-untyped-def]
            out = real(*a, **k)
            clock.now += FRESH  # the pack took as long as a look stays fresh
            return out

        monkeypatch.setattr(upload, "_upload_pack", slow)
        assert push_file(s, "b.bin", data(1 << 20, 2), listed) == {"gc": 3}
        clock.now += INDEX_EVERY - FRESH
        assert push_file(s, "c.bin", data(1 << 20, 3), listed) == {"gc": 3, "index": 1}
    assert_clean(s.root)


def test_after_a_failed_pass_or_a_lost_index_the_next_pass_lists_packs(tmp_path, rgw, s3_bucket, listed,
                                                                         monkeypatch):
    s, cfg, clock = clocked_store(tmp_path, rgw, s3_bucket)
    with s:
        push_file(s, "a.bin", data(1 << 20, 1), listed)
        real_put = Bucket.put

        def put_but_not_indexes(self, key, payload):  # type: ignore[no-untyped-def]
            if "/index/" in key:
                raise RemoteError("connection dropped (test)")
            return real_put(self, key, payload)

        monkeypatch.setattr(Bucket, "put", put_but_not_indexes)
        with pytest.raises(RemoteError, match="dropped"):
            push_file(s, "b.bin", data(1 << 20, 2), listed)
        monkeypatch.setattr(Bucket, "put", real_put)
        listed.clear()
        report = tier_of(s).push()
        assert report.adopted == 1 and report.packs == 0
        assert (listed["packs"], listed["index"]) == (1, 1)
        assert push_file(s, "c.bin", data(1 << 20, 3), listed) == {"gc": 2}  # the failure is dealt with
        # an index gone that no doomed list explains: packs/ is listed and the pack adopted again
        bucket = Bucket(cfg)
        name = bucket_keys(bucket, "index")[0].rsplit("/", 1)[1]
        bucket.delete([bucket.key("index", name)])
        clock.now += INDEX_EVERY
        s.write_file("/run/d.bin", data(1 << 20, 4))
        listed.clear()
        report = tier_of(s).push()
        assert report.adopted == 1 and listed["packs"] == 1
        assert bucket.key("index", name) in bucket_keys(bucket, "index")
        assert read_back(cfg, s.config.store_uuid, tmp_path) == {f"/run/{n}.bin": data(1 << 20, k + 1)
                                                                for k, n in enumerate("abcd")}
    assert_clean(s.root)


def bucket_keys(bucket: Bucket, part: str) -> list[str]:
    return sorted(o.key for o in Bucket.list(bucket, bucket.key(part, "")))


def test_a_small_pack_goes_up_without_a_head_and_a_large_one_is_looked_for_first(tmp_path, rgw, s3_bucket,
                                                                                   monkeypatch):
    heads: list[str] = []
    real = Bucket.exists

    def counting(self, key):  # type: ignore[no-untyped-def]
        heads.append(key)
        return real(self, key)

    monkeypatch.setattr(Bucket, "exists", counting)
    s, cfg = one_store(tmp_path, rgw, s3_bucket)
    with s:
        s.write_file("/run/a.bin", data(1 << 20, 1))
        assert tier_of(s).push().packs == 1
        assert not [k for k in heads if "/packs/" in k]
        big = data(upload.HEAD_ABOVE + (1 << 20), 2)
        s.write_file("/run/b.bin", big)
        assert tier_of(s).push().packs == 1
        assert len([k for k in heads if "/packs/" in k]) == 1
        assert read_back(cfg, s.config.store_uuid, tmp_path) == {"/run/a.bin": data(1 << 20, 1), "/run/b.bin": big}
    assert_clean(s.root)
