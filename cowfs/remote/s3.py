"""A bucket of an S3 engine, through boto3: the few calls the remote tier makes, each
failure turned into one line (`RemoteError`) that names the endpoint and never a key.

Retries: botocore's "standard" mode (exponential backoff with jitter, up to
`MAX_ATTEMPTS` tries for throttling, 5xx and connection errors). Large objects go up as
multipart uploads of `PART_SIZE` parts, `UPLOAD_THREADS` at a time. Every body goes with
its CRC-32 (ISA-L) and unhashed by the signature (docs/design.md, section 17, "Integrity
in transit").
"""
from __future__ import annotations

import base64
import configparser
import contextlib
import email.utils
import errno as _errno
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import boto3
import botocore.exceptions as bexc
from botocore.config import Config

from .. import _native
from ..errors import RemoteError
from .config import RemoteAddress, RemoteConfig

MAX_ATTEMPTS = 6
CONNECT_TIMEOUT = 5.0
READ_TIMEOUT = 60.0
PART_SIZE = 16 << 20
UPLOAD_THREADS = 4


def _crc32(body: bytes | bytearray) -> str:
    """An S3 CRC-32 checksum: zlib's CRC-32 (here by ISA-L), big-endian, base64."""
    return base64.b64encode(_native.crc32(body).to_bytes(4, "big")).decode()


class MissingObject(RemoteError):
    """An object the catalog or an index names is not in the bucket."""


class AccessDenied(RemoteError):
    errno = _errno.EACCES


@dataclass(frozen=True)
class ListedObject:
    key: str
    size: int
    modified: float = 0.0  # LastModified, seconds since the epoch on the engine's clock


@dataclass(frozen=True)
class IncompleteUpload:
    key: str
    upload_id: str
    initiated: float  # seconds since the epoch on the engine's clock


def _credentials(cfg: RemoteConfig) -> dict[str, str]:
    """Keys from the credentials file the config names; {} to use boto3's own chain
    (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, then ~/.aws/credentials)."""
    if cfg.credentials_file is None:
        return {}
    parser = configparser.ConfigParser()
    try:
        with open(cfg.credentials_file) as f:
            parser.read_file(f)
    except (OSError, configparser.Error) as e:
        raise RemoteError(f"{cfg.credentials_file}: unreadable credentials file ({type(e).__name__})") from None
    section = cfg.profile or "default"
    if not parser.has_section(section):
        raise RemoteError(f"{cfg.credentials_file}: no [{section}] section")
    sec = parser[section]
    if "aws_access_key_id" not in sec or "aws_secret_access_key" not in sec:
        raise RemoteError(f"{cfg.credentials_file}: [{section}] needs aws_access_key_id and aws_secret_access_key")
    out = {"aws_access_key_id": sec["aws_access_key_id"], "aws_secret_access_key": sec["aws_secret_access_key"]}
    if "aws_session_token" in sec:
        out["aws_session_token"] = sec["aws_session_token"]
    return out


class Bucket:
    """One bucket and prefix; safe to use from several threads."""

    def __init__(self, cfg: RemoteConfig) -> None:
        self.cfg = cfg
        self.address: RemoteAddress = cfg.address
        self.where = f"{cfg.url} at {cfg.endpoint or 'the AWS default endpoint'}"
        session = boto3.session.Session(**_credentials(cfg))
        config = Config(
            retries={"max_attempts": MAX_ATTEMPTS, "mode": "standard"},
            connect_timeout=CONNECT_TIMEOUT, read_timeout=READ_TIMEOUT,
            # the body is covered by the CRC-32 put() sends with it (ISA-L), not by botocore's
            # SHA-256 of every byte (its default over http) and zlib CRC-32: 2.1 -> 0.7 CPU s
            # per GiB uploaded (docs/benchmarks.md, "Remote tier"); the request stays signed
            s3={"addressing_style": "path", "payload_signing_enabled": False}, signature_version="s3v4",
            request_checksum_calculation="when_required",
            max_pool_connections=2 * UPLOAD_THREADS + 4,
        )
        self.client = session.client("s3", endpoint_url=cfg.endpoint, region_name=cfg.region or "us-east-1",
                                     config=config)
        self._lock = threading.Lock()

    def key(self, *parts: str) -> str:
        return self.address.key(*parts)

    # -- errors ---------------------------------------------------------------

    def _error(self, e: Exception, what: str) -> RemoteError:
        if isinstance(e, bexc.NoCredentialsError):
            return AccessDenied(f"{self.where}: no credentials (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
                                "or give --credentials FILE)")
        if isinstance(e, (bexc.EndpointConnectionError, bexc.ConnectTimeoutError, bexc.ReadTimeoutError,
                          bexc.ConnectionClosedError)):
            return RemoteError(f"{self.where}: cannot reach the endpoint ({type(e).__name__}) while {what}")
        if isinstance(e, bexc.ClientError):
            err = e.response.get("Error", {})
            code = str(err.get("Code", ""))
            status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in ("NoSuchKey", "404", "NotFound") and "bucket" not in what:
                return MissingObject(f"{self.where}: {what}: no such object")
            if code in ("NoSuchBucket",) or (code in ("404", "NotFound") and "bucket" in what):
                return RemoteError(f"{self.where}: the bucket {self.address.bucket} does not exist")
            if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "403") or status == 403:
                return AccessDenied(f"{self.where}: the endpoint refused the credentials ({code}) while {what}")
            return RemoteError(f"{self.where}: {code or status} while {what}")
        if isinstance(e, bexc.BotoCoreError):
            return RemoteError(f"{self.where}: {type(e).__name__} while {what}")
        return RemoteError(f"{self.where}: {type(e).__name__}: {e} while {what}")

    def _call(self, what: str, fn: Any, **kw: Any) -> Any:
        try:
            return fn(**kw)
        except (bexc.BotoCoreError, bexc.ClientError) as e:
            raise self._error(e, what) from None

    # -- calls ----------------------------------------------------------------

    def check(self) -> None:
        """Raise RemoteError unless the bucket answers to these credentials."""
        self._call("checking the bucket", self.client.head_bucket, Bucket=self.address.bucket)

    def create_bucket(self) -> bool:
        """Make the bucket; False if it was already there (and ours)."""
        try:
            self.client.create_bucket(Bucket=self.address.bucket)
            return True
        except bexc.ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                self.check()
                return False
            raise self._error(e, "creating the bucket") from None
        except bexc.BotoCoreError as e:
            raise self._error(e, "creating the bucket") from None

    def exists(self, key: str) -> bool:
        try:
            self.client.head_object(Bucket=self.address.bucket, Key=key)
            return True
        except bexc.ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise self._error(e, f"looking for {key}") from None
        except bexc.BotoCoreError as e:
            raise self._error(e, f"looking for {key}") from None

    def put(self, key: str, data: bytes | bytearray | memoryview | list[bytes | bytearray]) -> None:
        """Store `data` under `key` (multipart above PART_SIZE, UPLOAD_THREADS parts at a time);
        the object appears whole or not at all. Every body goes with its CRC-32
        (`x-amz-checksum-crc32`), which the engine checks where it supports it. A list is the
        object's parts, each of PART_SIZE bytes but the last, sent as they are (a bytearray
        needs no copy: packs.PackArena)."""
        what = f"uploading {key}"
        try:
            if isinstance(data, list) and len(data) > 1:
                bodies = data
                self._put_parts(key, len(bodies), lambda k: bodies[k])
            else:
                one = data[0] if isinstance(data, list) else data
                if len(one) <= PART_SIZE:
                    body = one if isinstance(one, (bytes, bytearray)) else bytes(memoryview(one).cast("B"))
                    self.client.put_object(Bucket=self.address.bucket, Key=key, Body=body, ChecksumCRC32=_crc32(body))
                else:
                    view = memoryview(one).cast("B")
                    self._put_parts(key, -(-len(view) // PART_SIZE),
                                    lambda k: bytes(view[k * PART_SIZE:(k + 1) * PART_SIZE]))
        except (bexc.BotoCoreError, bexc.ClientError) as e:
            raise self._error(e, what) from None
        except RemoteError:
            raise
        except Exception as e:  # noqa: BLE001 - below botocore (a socket, a part's thread): one line too
            raise RemoteError(f"{self.where}: {type(e).__name__} while {what}") from None

    def _put_parts(self, key: str, count: int, body_of: Callable[[int], bytes | bytearray]) -> None:
        """A multipart upload of `count` parts; aborted if any part fails (remote gc aborts any
        an abort missed)."""
        upload_id = self.client.create_multipart_upload(Bucket=self.address.bucket, Key=key,
                                                        ChecksumAlgorithm="CRC32")["UploadId"]

        def part(k: int) -> dict[str, Any]:
            body = body_of(k)
            crc = _crc32(body)
            resp = self.client.upload_part(Bucket=self.address.bucket, Key=key, UploadId=upload_id,
                                           PartNumber=k + 1, Body=body, ChecksumCRC32=crc)
            return {"ETag": resp["ETag"], "PartNumber": k + 1, "ChecksumCRC32": crc}

        try:
            with ThreadPoolExecutor(UPLOAD_THREADS, thread_name_prefix="cowfs-upload-part") as pool:
                parts = list(pool.map(part, range(count)))
            self.client.complete_multipart_upload(Bucket=self.address.bucket, Key=key, UploadId=upload_id,
                                                  MultipartUpload={"Parts": parts})
        except BaseException:
            with contextlib.suppress(Exception):  # the failure that matters is the one being raised
                self.client.abort_multipart_upload(Bucket=self.address.bucket, Key=key, UploadId=upload_id)
            raise

    def get(self, key: str) -> bytes:
        resp = self._call(f"reading {key}", self.client.get_object, Bucket=self.address.bucket, Key=key)
        return self._body(resp, key)

    def get_range(self, key: str, start: int, length: int) -> bytes:
        """Bytes start..start+length of an object (one ranged GET)."""
        return b"".join(self.range_pieces(key, start, length, max(length, 1)))  # one piece: no copy

    def range_pieces(self, key: str, start: int, length: int, piece: int) -> Iterator[bytes]:
        """Bytes start..start+length of an object by one ranged GET, yielded in pieces of
        `piece` bytes (the last may be shorter) as the body arrives: one request for several
        pieces (botocore costs about as much CPU per request as per 5 MiB of body)."""
        if length <= 0:
            return
        resp = self._call(f"reading {key}", self.client.get_object, Bucket=self.address.bucket, Key=key,
                          Range=f"bytes={start}-{start + length - 1}")
        got = 0
        try:
            while got < length:
                want = min(piece, length - got)
                try:
                    parts = [resp["Body"].read(want)]
                    while parts[-1] and sum(map(len, parts)) < want:  # a read may return less than asked
                        parts.append(resp["Body"].read(want - sum(map(len, parts))))
                except (bexc.BotoCoreError, OSError) as e:
                    raise RemoteError(f"{self.where}: the connection dropped while reading {key} "
                                      f"({type(e).__name__})") from None
                part = parts[0] if len(parts) == 1 else b"".join(parts)
                if len(part) != want:
                    raise RemoteError(f"{self.where}: {key} is shorter than expected ({start + got + len(part)} bytes)")
                got += want
                yield part
        finally:
            if got < length:  # cut short: the connection is not reused with a body half read
                resp["Body"].close()

    def _body(self, resp: dict[str, Any], key: str) -> bytes:
        try:
            return resp["Body"].read()
        except (bexc.BotoCoreError, OSError) as e:
            raise RemoteError(f"{self.where}: the connection dropped while reading {key} ({type(e).__name__})") from None

    def list(self, prefix: str) -> Iterator[ListedObject]:
        """Every object whose key starts with `prefix`, in key order."""
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.address.bucket, Prefix=prefix)
        try:
            for page in pages:
                for obj in page.get("Contents", []):
                    yield ListedObject(obj["Key"], int(obj["Size"]), obj["LastModified"].timestamp())
        except (bexc.BotoCoreError, bexc.ClientError) as e:
            raise self._error(e, f"listing {prefix}") from None

    def subfolders(self, prefix: str) -> list[str]:
        """The names one level below `prefix` (a LIST with the '/' delimiter: its common
        prefixes, not every object under them), sorted."""
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.address.bucket, Prefix=prefix,
                                                                      Delimiter="/")
        try:
            return sorted(p["Prefix"][len(prefix):].rstrip("/") for page in pages for p in page.get("CommonPrefixes", []))
        except (bexc.BotoCoreError, bexc.ClientError) as e:
            raise self._error(e, f"listing {prefix}") from None

    def clock(self) -> float:
        """The engine's time now (its Date header, whole seconds, never ahead of its clock), so
        ages of objects are measured against their LastModified on one clock."""
        resp = self._call("reading the engine's clock", self.client.head_bucket, Bucket=self.address.bucket)
        date = resp.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
        try:
            return email.utils.parsedate_to_datetime(date).timestamp()
        except (TypeError, ValueError):
            raise RemoteError(f"{self.where}: the engine sent no usable Date header ({date!r})") from None

    def incomplete_uploads(self, prefix: str) -> Iterator[IncompleteUpload]:
        """Multipart uploads under `prefix` begun and neither completed nor aborted."""
        pages = self.client.get_paginator("list_multipart_uploads").paginate(Bucket=self.address.bucket, Prefix=prefix)
        try:
            for page in pages:
                for up in page.get("Uploads", []):
                    yield IncompleteUpload(up["Key"], up["UploadId"], up["Initiated"].timestamp())
        except (bexc.BotoCoreError, bexc.ClientError) as e:
            raise self._error(e, f"listing the incomplete uploads under {prefix}") from None

    def abort_upload(self, up: IncompleteUpload) -> None:
        try:
            self.client.abort_multipart_upload(Bucket=self.address.bucket, Key=up.key, UploadId=up.upload_id)
        except bexc.ClientError as e:
            if e.response.get("Error", {}).get("Code") != "NoSuchUpload":  # completed or aborted meanwhile
                raise self._error(e, f"aborting an upload of {up.key}") from None
        except bexc.BotoCoreError as e:
            raise self._error(e, f"aborting an upload of {up.key}") from None

    def delete(self, keys: list[str]) -> None:
        for i in range(0, len(keys), 1000):
            part = keys[i:i + 1000]
            resp = self._call("deleting objects", self.client.delete_objects, Bucket=self.address.bucket,
                              Delete={"Objects": [{"Key": k} for k in part], "Quiet": True})
            errors = resp.get("Errors") or []
            if errors:
                raise RemoteError(f"{self.where}: deleting {errors[0].get('Key')}: {errors[0].get('Code')}")
