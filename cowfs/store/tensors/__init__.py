"""Tensor storage: checkpoint files recognised and their tensors stored as pieces and deltas.

Owns checkpoint formats and their tensor regions (formats/), the cut of a file into tensor
pieces (pieces) and where a file's pieces lie while it is written (write_layout), the
lineage of each piece and the delta chain rule (lineage), and the compactor that re-cuts and
re-encodes bodies (compact, compact_body, recent).

May import: data, catalog, log, parts.
"""
