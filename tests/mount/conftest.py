"""Fixtures of the mount tests: store_path, the Path of a new store (16 MiB segments) that
must fsck clean at teardown. Tests mount it with tests.support.mountutil.mounted."""
from tests.support.mountutil import store_path  # noqa: F401 (a fixture)
