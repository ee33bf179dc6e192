"""torch.distributed.checkpoint (DCP) `.distcp` files written by FileSystemWriter.

With the default serialization (SerializationFormat.TORCH_SAVE) a .distcp file is a
sequence of items written back to back: `_write_item` calls `torch.save(item, stream)` for
every tensor item and writes every non-tensor ("bytes") item as the bytes of its own
torch.save. So the file is a concatenation of complete torch.save zip archives, whose
internal offsets are relative to each archive's first byte. (With
SerializationFormat.SAFETENSORS the file is one safetensors file and is recognised as one.)

By content (`parse`): the last archive's end-of-central-directory record ends at the file
end; it gives the archive's central directory offset and size, hence where the archive
begins; that is where the previous archive ends, and so on back to offset 0. Each archive
is read like a torch.save file (torchzip). Names: "I:NAME" where I is the archive's index
in the file (0-based, bytes items included) and NAME its torchzip name (for a tensor item
"data/0"). DCP writes the items of one state-dict structure in the same order every time,
so the names are stable across checkpoints of one run; but they say nothing of the fqn.

With the `.metadata` written beside the .distcp files (`distcp_regions`): the Metadata
pickle is read with `_pickle.run` (never unpickled); its `storage_data` maps
MetadataIndex(fqn, offset, index) -> _StorageInfo(relative_path, offset, length). Every
archive of the file must appear there with its exact offset and length; a tensor item's
region is then named by its fqn ("model.layers.0.weight", "optim.state.0.exp_avg"),
suffixed "@o1,o2,..." when the chunk's offsets in the global tensor are not all zero.
With SerializationFormat.SAFETENSORS, a file that also holds non-tensor items starts with
their archives and ends with one safetensors blob; only the .metadata says where the blob
starts (by content such a file is not recognised). The .metadata is written after the .distcp files, so an engine that names by fqn has to
wait for it; the by-content names need nothing but the file."""
from __future__ import annotations

import os
from dataclasses import replace

from . import _pickle, _zip, safetensors, torchzip
from ._base import Malformed, Reader, ReadFn, TensorRegion, check, int_tuple

MAX_ARCHIVES = 1 << 20


def split(reader: Reader) -> list[_zip.Archive]:
    """The zip archives that tile [0, size) exactly, first to last."""
    out: list[_zip.Archive] = []
    end = reader.size
    while end > 0:
        if len(out) >= MAX_ARCHIVES:
            raise Malformed("distcp: too many archives")
        archive = _zip.read_archive(reader, end)
        if archive.base >= end:
            raise Malformed("distcp: empty archive")
        out.append(archive)
        end = archive.base
    if not out:
        raise Malformed("distcp: empty file")
    out.reverse()
    return out


def parse(reader: Reader) -> list[TensorRegion]:
    """Regions of concatenated torch.save archives, named "I:NAME" (see the module doc)."""
    out: list[TensorRegion] = []
    for i, archive in enumerate(split(reader)):
        out += [replace(r, name=f"{i}:{r.name}")
                for r in torchzip.archive_regions(reader, archive)]
    return out


def metadata_items(metadata: bytes, relative_path: str) -> list[tuple[int, int, str]]:
    """From a DCP .metadata pickle: (offset, length, name) of each item stored in the file
    `relative_path`, in the order listed. Raises Malformed if it cannot tell."""
    root = _pickle.run(metadata)
    if not (isinstance(root, _pickle.Call)
            and root.named("torch.distributed.checkpoint.metadata", "Metadata")
            and isinstance(root.state, _pickle.Dict)):
        raise Malformed("distcp: .metadata is not a Metadata object")
    storage = root.state.get("storage_data")
    if not isinstance(storage, _pickle.Dict):
        raise Malformed("distcp: .metadata has no storage_data")
    out: list[tuple[int, int, str]] = []
    for key, info in storage.items:
        k = _state(key, "torch.distributed.checkpoint.metadata", "MetadataIndex")
        v = _state(info, "torch.distributed.checkpoint.filesystem", "_StorageInfo")
        path, offset, length = v.get("relative_path"), v.get("offset"), v.get("length")
        if path != relative_path:
            continue
        fqn = k.get("fqn")
        if not isinstance(fqn, str) or type(offset) is not int or type(length) is not int:
            raise Malformed("distcp: bad storage_data entry")
        chunk = k.get("offset")
        if isinstance(chunk, _pickle.Call) and chunk.named("torch", "Size"):
            chunk = chunk.args[0] if isinstance(chunk.args, tuple) and chunk.args else None
        offs = int_tuple(chunk) if chunk is not None else ()
        if offs is None:
            raise Malformed("distcp: bad chunk offsets")
        out.append((offset, length, fqn if not any(offs) else f"{fqn}@{','.join(map(str, offs))}"))
    return out


def _state(obj: object, module: str, cls: str) -> _pickle.Dict:
    if not (isinstance(obj, _pickle.Call) and obj.named(module, cls)
            and isinstance(obj.state, _pickle.Dict)):
        raise Malformed(f"distcp: expected a {cls}")
    return obj.state


def _named_archives(reader: Reader, items: list[tuple[int, int, str]]) -> list[TensorRegion]:
    """SerializationFormat.TORCH_SAVE: every archive is one listed item."""
    by_offset: dict[int, tuple[int, str]] = {}
    for offset, length, name in items:
        if offset in by_offset:
            raise Malformed("distcp: two items at one offset")
        by_offset[offset] = (length, name)
    out: list[TensorRegion] = []
    for archive in split(reader):
        length, name = by_offset.get(archive.base, (-1, ""))
        if length != archive.end - archive.base:
            raise Malformed("distcp: an archive the metadata does not list")
        found = torchzip.archive_regions(reader, archive)
        if len(found) == 1:
            out.append(replace(found[0], name=name))
        else:
            out += [replace(r, name=f"{name}/{r.name}") for r in found]
    return out


def distcp_regions(head: bytes, size: int, read: ReadFn, name_hint: str,
                   metadata: bytes) -> list[TensorRegion] | None:
    """Like `regions()` for a .distcp file, but names tensors by fqn using the bytes of the
    `.metadata` file of the same checkpoint directory; the file's relative_path there is
    the base name of `name_hint`. None if the file or the metadata does not fit (the
    engine can then fall back to `regions()`).

    Also reads SerializationFormat.SAFETENSORS files that hold non-tensor items: those
    items' archives come first and one safetensors blob follows, starting at the offset
    DCP records for every tensor item of the file (the largest listed offset)."""
    try:
        reader = Reader(head, size, read)
        items = metadata_items(metadata, os.path.basename(name_hint))
        if not items:
            raise Malformed("distcp: the metadata lists nothing in this file")
        try:
            out = _named_archives(reader, items)
        except Malformed:
            out = safetensors.parse(reader, max(offset for offset, _, _ in items))
        return check(out, size)
    except Exception:  # noqa: BLE001 - the engine must never see a parser exception
        return None
