"""Fixtures of the harness tests: store_path as in the mount tests, the Path of a new store
(16 MiB segments) that must fsck clean at teardown."""
from tests.support.mountutil import store_path  # noqa: F401 (a fixture)
