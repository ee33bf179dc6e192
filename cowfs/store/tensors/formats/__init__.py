"""Checkpoint file formats: which byte ranges of a file are tensors, and which tensors.

`regions(head, size, read, name_hint)` recognises a file by content and lists its tensor
regions, so the engine can cut it at tensor boundaries and line piece k of tensor T up
with piece k of T in the previous checkpoint. Recognised (docs/format.md, "Recognised
checkpoint formats"):

* safetensors (safetensors.py): names are the JSON keys;
* torch.save zip archives (torchzip.py): names are state-dict paths ("state.0.exp_avg");
* torch.distributed.checkpoint .distcp files (distcp.py): concatenated torch.save
  archives, names "I:data/0" by content, or fqns with `distcp_regions` and the .metadata;
* NumPy .npy ("array") and uncompressed .npz (member names) (npy.py).

Pure standard library: no torch, no numpy, and nothing is ever unpickled (pickles are read
by a symbolic machine, _pickle.py). Only headers, zip directories and pickles are read,
never tensor data; a parse reads at most _base.MAX_READ_TOTAL bytes."""
from __future__ import annotations

from . import _zip, distcp, npy, safetensors, torchzip
from ._base import Malformed, Reader, ReadFn, TensorRegion, check
from .distcp import distcp_regions

__all__ = ["TensorRegion", "distcp_regions", "regions"]


def regions(head: bytes, size: int, read: ReadFn, name_hint: str) -> list[TensorRegion] | None:
    """Tensor regions of a file, sorted by offset, non-overlapping, each within [0, size)
    and non-empty, names unique; None when the format is not recognised or the file is
    malformed or truncated. Never raises.

    head: the file's first bytes (up to 64 KiB, may be shorter); size: the file size;
    read(offset, length): `length` bytes of the file at `offset`; name_hint: the file's
    path. Recognition is by content (magic numbers and header sanity); the extension only
    decides which parser is tried first."""
    try:
        if not isinstance(head, (bytes, bytearray, memoryview)):
            return None
        reader = Reader(bytes(head), size, read)
        if len(reader.head) < min(size, 64):  # a short head: fetch the first bytes
            reader.head = reader(0, min(size, 1 << 16))
        parsers = _candidates(reader.head, size)
        if not parsers:
            return None
        hint = str(name_hint).lower()
        parsers.sort(key=lambda p: not any(hint.endswith(e) for e in _EXTENSIONS[p]))
        for parser in parsers:
            try:
                return check(_PARSE[parser](reader), size)
            except Malformed:
                continue
        return None
    except Exception:  # noqa: BLE001 - the engine must never see a parser exception
        return None


_EXTENSIONS = {
    "safetensors": (".safetensors",),
    "zip": (".pt", ".pth", ".bin", ".ckpt", ".distcp", ".npz"),
    "npy": (".npy",),
}


def _candidates(head: bytes, size: int) -> list[str]:
    out = []
    if head[:4] == b"PK\x03\x04":
        out.append("zip")
    if npy.looks_like(head):
        out.append("npy")
    if safetensors.looks_like(head, size):
        out.append("safetensors")
    return out


def _parse_zip(reader: Reader) -> list[TensorRegion]:
    """One torch.save archive, an .npz, or (archive not starting at 0) a .distcp file."""
    archive = _zip.read_archive(reader, reader.size)
    if archive.base != 0:
        return distcp.parse(reader)
    if torchzip.is_torch_archive(archive):
        return torchzip.archive_regions(reader, archive)
    if npy.is_npz(archive):
        return npy.parse_npz(reader, archive)
    raise Malformed("zip: neither torch.save nor npz")


_PARSE = {"safetensors": safetensors.parse, "zip": _parse_zip, "npy": npy.parse}
