"""A checkpoint series on disk cut the way the engine will cut it: tensor pieces and chunks.

A series directory holds one sub-directory per version (Trainer's checkpoint-20/,
checkpoint-40/, ... or save-N/), sorted by the number after the last '-'. Every file of a
version is read whole and handed to the engine's format parser
(`cowfs.store.tensors.formats.regions`); each tensor region is cut into pieces of at most
`piece_bytes` (rounded down to a multiple of the element size), so piece k of tensor T
lines up with piece k of T in another version (same file path, tensor name, dtype and
length). The bytes between regions, and files the parser does not recognise, are cut with
the engine's content-defined chunking (FastCDC, ~64 KiB): the "rest".

A bench tool: cowfs/ never imports it; no torch.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from cowfs.store.data.chunking import cut_all
from cowfs.store.tensors.formats import TensorRegion, regions

OPTIMIZER_ROLES = ("exp_avg_sq", "exp_avg", "step", "momentum_buffer", "max_exp_avg_sq")


@dataclass(frozen=True)
class Piece:
    file: str  # path relative to the version directory
    tensor: str  # the region's name (formats.TensorRegion.name)
    dtype: str
    elem_size: int
    index: int  # piece number inside the tensor
    offset: int  # in the file
    length: int
    tensor_length: int

    @property
    def key(self) -> tuple[str, str, str, int, int]:
        """What must be equal for a piece to be the base of another."""
        return (self.file, self.tensor, self.dtype, self.tensor_length, self.index)

    @property
    def category(self) -> str:
        """The file's name and the tensor's role: 'optimizer.pt:exp_avg', 'model.safetensors:param'."""
        last = self.tensor.rsplit(".", 1)[-1]
        role = last if last in OPTIMIZER_ROLES else ("param" if self.file.endswith(".safetensors") else "other")
        return f"{Path(self.file).name}:{role}"


@dataclass
class Version:
    name: str
    files: dict[str, bytes]  # relative path -> content
    pieces: list[Piece]
    rest: list[memoryview]  # the non-tensor bytes, as CDC chunks
    digests: list[bytes] = field(default_factory=list)  # per piece, a hash of its bytes

    @property
    def logical(self) -> int:
        return sum(len(b) for b in self.files.values())

    @property
    def tensor_bytes(self) -> int:
        return sum(p.length for p in self.pieces)

    def view(self, p: Piece) -> memoryview:
        return memoryview(self.files[p.file])[p.offset:p.offset + p.length]


def version_dirs(series: Path) -> list[Path]:
    dirs = [p for p in series.iterdir() if p.is_dir() and p.name.rsplit("-", 1)[-1].isdigit()]
    return sorted(dirs, key=lambda p: int(p.name.rsplit("-", 1)[-1]))


def cut(region: TensorRegion, file: str, piece_bytes: int) -> list[Piece]:
    size = max(region.elem_size, 1)
    step = max(size, piece_bytes - piece_bytes % size)
    return [Piece(file, region.name, region.dtype, size, k, region.offset + lo,
                  min(step, region.length - lo), region.length)
            for k, lo in enumerate(range(0, region.length, step))]


def file_regions(data: bytes, name: str) -> list[TensorRegion]:
    found = regions(data[:1 << 16], len(data), lambda off, n: data[off:off + n], name)
    return found or []


def load_version(vdir: Path, piece_bytes: int) -> Version:
    files: dict[str, bytes] = {}
    pieces: list[Piece] = []
    rest: list[memoryview] = []
    for f in sorted(p for p in vdir.rglob("*") if p.is_file()):
        rel = str(f.relative_to(vdir))
        data = f.read_bytes()
        files[rel] = data
        mv = memoryview(data)
        pos = 0
        for region in file_regions(data, rel):
            if region.offset > pos:
                rest.extend(cut_all(mv[pos:region.offset]))
            pieces.extend(cut(region, rel, piece_bytes))
            pos = region.offset + region.length
        if pos < len(data):
            rest.extend(cut_all(mv[pos:]))
    version = Version(vdir.name, files, pieces, rest)
    version.digests = [hashlib.blake2b(version.view(p), digest_size=16).digest() for p in pieces]
    return version


def load_series(series: Path, piece_bytes: int) -> list[Version]:
    return [load_version(v, piece_bytes) for v in version_dirs(series)]


def base_index(target: Version, base: Version) -> list[int | None]:
    """For each piece of `target`, the index of the same piece in `base` (None if absent)."""
    where = {p.key: i for i, p in enumerate(base.pieces)}
    return [where.get(p.key) for p in target.pieces]


def duplicates(series: list[Version]) -> list[list[bool]]:
    """Per version and piece: True when the same bytes are also a piece of a newer version
    (or earlier in the same one), so global dedup stores it once, with its newest copy."""
    seen: set[bytes] = set()
    out: list[list[bool]] = [[] for _ in series]
    for vi in range(len(series) - 1, -1, -1):
        flags = []
        for d in series[vi].digests:
            flags.append(d in seen)
            seen.add(d)
        out[vi] = flags
    return out
