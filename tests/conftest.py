"""Suite-wide collection order: tests marked `long` start first. Under pytest-xdist a worker
takes tests in collection order, so a test of a minute or two collected last would end the
run alone while the other worker idles; started first, it runs beside the short ones."""
from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.get_closest_marker("long") is None)  # stable: otherwise as collected
