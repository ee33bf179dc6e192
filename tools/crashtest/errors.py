"""The harness's own failure, as opposed to a finding about cowfs."""
from __future__ import annotations


class HarnessError(Exception):
    """A failure of the harness itself (not a finding about cowfs)."""
