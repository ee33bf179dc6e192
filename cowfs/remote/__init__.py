"""The remote tier: a store's chunks and catalog in an S3 bucket (docs/design.md, section 17).

Knows nothing of FUSE; uses the engine (`cowfs.store`) through its public parts.
"""
