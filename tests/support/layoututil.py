"""Helpers of the write-layout tests: a file fed to a WriteLayout and the chunker batch by
batch as a write session feeds them, and a stored file's extents."""
from __future__ import annotations

from cowfs.store import Store
from cowfs.store.data.chunking import StreamChunker, stream_reader
from cowfs.store.data.content import Extent, load_extents
from cowfs.store.tensors import formats
from cowfs.store.tensors.pieces import plan
from cowfs.store.tensors.write_layout import WriteLayout


def fed(blob: bytes, sizes: list[int]) -> tuple[WriteLayout, set[int]]:
    """Feed `blob` in batches of `sizes` (cycled) as a session does: the layout learns from the
    chunker's carry and the batch, the chunker cuts with the regions (and hold) it gives.
    The layout, and the chunk ends."""
    layout, chunker, ends = WriteLayout(), StreamChunker(), set()
    pos, i = 0, 0
    while True:
        n = sizes[i % len(sizes)]
        data = blob[pos:pos + n]
        pos, i = pos + len(data), i + 1
        final = pos >= len(blob)
        start = chunker.offset
        pieces = [chunker.carry, data] if chunker.carried else [data]
        layout.learn(start, pos, stream_reader(pieces, start), final)
        batch = chunker.cut(data, final=final, fixed=layout.regions(start, pos))
        at = batch.start
        for length in batch.sizes():
            at += length
            ends.add(at)
        if final:
            return layout, ends


def learnt(layout: WriteLayout) -> list[tuple[int, int]]:
    """The pieces of the regions a layout knows."""
    out = []
    for start, stop, step in layout.known:
        out += [(o, min(o + step, stop)) for o in range(start, stop, step)]
    return out


def compactor_pieces(blob: bytes, name: str) -> list[tuple[int, int]]:
    """The pieces the compactor cuts a file named `name` with these bytes into."""
    found = formats.regions(blob[:1 << 16], len(blob), lambda o, n: blob[o:o + n], name)
    assert found is not None, name
    return [(s.offset, s.end) for s in plan(len(blob), found) if s.key is not None]


def extents(store: Store, ino: int) -> list[Extent]:
    attr = store.getattr(ino)
    return store.catalog.read(lambda c: load_extents(c, attr.content_id))
