"""Tensor storage: checkpoint files recognised and their tensors stored as pieces and deltas.

Owns checkpoint formats and their tensor regions (formats/), the cut of a file into tensor
pieces (pieces), the lineage of each piece and the delta chain rule (lineage), and the
compactor that re-cuts and re-encodes bodies (compact, compact_body).

May import: data, catalog, log, parts.
"""
