"""The log: append-only segment files and the records in them.

Owns the store directory's layout and `cowfs-store.json` (layout), the record and segment
header encoding with its checksums (records), record payload codecs (codecs), the three
devices a segment can live on (device), reusable I/O buffers (buffers), segments evicted
to a bucket (evicted), and `Log`, the head segment with rotation, batched appends and
checked reads (log).

May import: nothing else of the engine.
"""
