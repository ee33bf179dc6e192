"""Fixtures of the remote-tier tests (docs/remote-tests.md):

- `rgw` (module scope): a started RgwCluster (tests/support/rgw.py), one real Ceph cluster
  per test module; `rgw.credentials` is an RgwCredentials(endpoint, access_key, secret_key,
  region). Stopped by its pids at the end of the module, also when tests failed.
- `s3_bucket`: an S3Bucket(name, client, credentials), a new empty bucket for each test with
  a boto3 client (SigV4, path-style) for it.
- `aws_env`: the cluster's keys in AWS_* for the CLI and daemons a test starts (a module uses
  it through `pytestmark = pytest.mark.usefixtures("aws_env")`).
"""
from __future__ import annotations

import re
import shutil
import uuid
from dataclasses import dataclass
from typing import Any, Generator, Iterator

import pytest

from tests.support.rgw import RgwCluster, RgwCredentials, missing_binaries, s3_client

_FAILED = pytest.StashKey[bool]()
_SUMMARY = pytest.StashKey[list[str]]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed and (module := item.getparent(pytest.Module)) is not None:
        module.stash[_FAILED] = True   # keep that module's cluster directory (logs) for a look
    return report


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if lines := terminalreporter.config.stash.get(_SUMMARY, []):
        terminalreporter.section("rgw clusters")
        for line in lines:
            terminalreporter.write_line(line)


@pytest.fixture(scope="module")
def rgw(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RgwCluster]:
    """One mon, one OSD and radosgw on 127.0.0.1 for this module's tests."""
    if missing := missing_binaries():  # make setup installs them: a missing one fails, never skips
        pytest.fail(f"Ceph not installed ({', '.join(missing)} missing): run make setup", pytrace=False)
    root = tmp_path_factory.mktemp("rgw")
    cluster = RgwCluster(root)
    cluster.start()                    # stops what it started if it fails
    try:
        yield cluster
    finally:
        peak = cluster.rss_bytes(peak=True)
        cluster.stop()
        request.config.stash.setdefault(_SUMMARY, []).append(
            f"{request.node.nodeid}: bring-up {cluster.startup_seconds:.1f} s "
            f"({cluster.phases}), daemons' peak RSS {peak / 2**20:.0f} MiB, in {root}")
        if not request.node.stash.get(_FAILED, False):
            shutil.rmtree(root, ignore_errors=True)


@dataclass(frozen=True)
class S3Bucket:
    name: str
    client: Any              # boto3 S3 client
    credentials: RgwCredentials


@pytest.fixture
def s3_bucket(rgw: RgwCluster, request: pytest.FixtureRequest) -> S3Bucket:
    """A new empty bucket on the module's cluster, named after the test."""
    assert rgw.credentials is not None
    stem = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40]
    name = f"{stem}-{uuid.uuid4().hex[:8]}".lstrip("-")
    client = s3_client(rgw.credentials)
    client.create_bucket(Bucket=name)
    return S3Bucket(name, client, rgw.credentials)


@pytest.fixture
def aws_env(rgw: RgwCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """The module's cluster's keys in AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, as the daemons
    and the CLI read them (`pytestmark = pytest.mark.usefixtures("aws_env")` in a module)."""
    assert rgw.credentials is not None
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", rgw.credentials.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", rgw.credentials.secret_key)
