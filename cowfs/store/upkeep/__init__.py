"""Upkeep: what keeps a store whole and small, and what reports on it.

Owns garbage collection (gc), checking and repair (fsck), eviction of segments to a bucket
and their restore (evict), tree comparison (diff), sizes (stats), restoring a directory as
of a generation (restore_tree), and the snapshot retention rules of prune (retention).

May import: tensors, data, catalog, log, parts.
"""
