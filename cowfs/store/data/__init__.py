"""The data path: file bytes into versions and back.

Owns content-defined chunking and chunk ids (chunking), how many threads a write batch's
native calls use (batch_threads), new chunks into the log (chunk_writer), a version's
extents (content), dedup look-ups, pins and `gc_lock` (index), what open readers and
sessions hold against gc (holds), write sessions with their overlay (session, overlay), the
commit transaction of a new version (commit), and readers that serve committed versions
(reader).

May import: catalog, log.
"""
