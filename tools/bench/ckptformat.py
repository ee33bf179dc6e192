"""Checkpoint series on disk -> tensor byte ranges and pieces, without torch.

A series directory holds one sub-directory per version (checkpoint-20/, checkpoint-40/ ...
or save-20/ ...), sorted by the number after the last '-'. Files are matched across
versions by relative path. A file is cut at tensor boundaries:
  - safetensors: 8-byte little-endian header length, JSON header (dtype, shape,
    data_offsets relative to the end of the header);
  - torch.save zip: the storages are the stored (uncompressed) `*/data/N` entries; their
    dtype and their role in an optimizer state dict (exp_avg, exp_avg_sq, step, ...) come
    from `data.pkl` read with pickletools (never unpickled).
Everything that is not a tensor (headers, data.pkl, zip records, small files) is "rest".
Tensors are cut into pieces of at most `piece_bytes` (a multiple of the element size);
piece k of a tensor lines up with piece k of the same tensor (same key, dtype, size) in
another version.
"""
from __future__ import annotations

import json
import pickletools
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path

SAFETENSORS_DTYPES = {"BF16": ("bf16", 2), "F16": ("f16", 2), "F32": ("f32", 4), "F64": ("f64", 8),
                      "I64": ("i64", 8), "I32": ("i32", 4), "I16": ("i16", 2), "I8": ("i8", 1),
                      "U8": ("u8", 1), "BOOL": ("bool", 1)}
TORCH_STORAGES = {"BFloat16Storage": ("bf16", 2), "HalfStorage": ("f16", 2), "FloatStorage": ("f32", 4),
                  "DoubleStorage": ("f64", 8), "LongStorage": ("i64", 8), "IntStorage": ("i32", 4),
                  "ShortStorage": ("i16", 2), "CharStorage": ("i8", 1), "ByteStorage": ("u8", 1),
                  "BoolStorage": ("bool", 1)}
ROLES = ("exp_avg_sq", "exp_avg", "step", "momentum_buffer", "max_exp_avg_sq")
SMALL_FILE = 256 << 10  # files below this are not cut: they count as rest


@dataclass(frozen=True)
class TensorRange:
    key: str  # tensor name (safetensors) or storage key (zip)
    role: str  # "param" for model files, an optimizer state name, or "other"
    dtype: str
    itemsize: int
    offset: int  # in the file
    nbytes: int


@dataclass(frozen=True)
class Piece:
    file: str  # relative path in the version
    key: str
    role: str
    dtype: str
    itemsize: int
    index: int  # piece number inside the tensor
    offset: int
    nbytes: int
    tensor_nbytes: int

    @property
    def match(self) -> tuple[str, str, str, int, int]:
        """What must be equal for a piece to be the base of another."""
        return (self.file, self.key, self.dtype, self.tensor_nbytes, self.index)

    @property
    def category(self) -> str:
        return f"{Path(self.file).name}:{self.role}"


def parse_safetensors(data: bytes) -> list[TensorRange]:
    (hlen,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(data[8:8 + hlen])
    base = 8 + hlen
    out = []
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        dtype, size = SAFETENSORS_DTYPES.get(meta["dtype"], (meta["dtype"].lower(), 1))
        lo, hi = meta["data_offsets"]
        out.append(TensorRange(name, "param", dtype, size, base + lo, hi - lo))
    return out


def storage_info(pickle_bytes: bytes) -> dict[str, tuple[str, int, str]]:
    """Storage key -> (dtype, itemsize, role) from a torch.save data.pkl, by reading the
    opcodes: a persistent id is the tuple ('storage', <GLOBAL torch XStorage>, key,
    location, numel) just before BINPERSID. The role is the dict key the tensor is stored
    under (the last string before the tuple): an optimizer state name (exp_avg, ...), else
    "param" for a dotted parameter name, else "other". Memo puts/gets are followed so
    repeated names and globals resolve."""
    memo: dict[int, object] = {}
    recent: list[object] = []  # values pushed, in order (MARK and structure ops ignored)
    out: dict[str, tuple[str, int, str]] = {}
    for op, arg, _pos in pickletools.genops(pickle_bytes):
        name = op.name
        if name in ("BINUNICODE", "SHORT_BINUNICODE", "UNICODE", "BINUNICODE8", "BINSTRING",
                    "SHORT_BINSTRING", "STRING", "BININT", "BININT1", "BININT2", "LONG1", "INT", "LONG"):
            recent.append(arg)
        elif name == "GLOBAL":
            recent.append(("global", arg))
        elif name in ("BINPUT", "LONG_BINPUT", "PUT"):
            memo[int(arg)] = recent[-1] if recent else None
        elif name == "MEMOIZE":
            memo[len(memo)] = recent[-1] if recent else None
        elif name in ("BINGET", "LONG_BINGET", "GET"):
            recent.append(memo.get(int(arg)))
        elif name == "BINPERSID" and len(recent) >= 5:
            tag, kind, key = recent[-5], recent[-4], recent[-3]
            if tag == "storage" and isinstance(kind, tuple) and isinstance(key, str):
                storage = str(kind[1]).split()[-1]
                dtype, size = TORCH_STORAGES.get(storage, (storage, 1))
                out[key] = (dtype, size, _role(recent[:-5]))
        if len(recent) > 64:
            del recent[:32]
    return out


def _role(before: list[object]) -> str:
    for value in reversed(before[-4:]):
        if isinstance(value, str):
            return value if value in ROLES else ("param" if "." in value else "other")
    return "other"


def parse_torch_zip(path: Path) -> list[TensorRange]:
    out = []
    with zipfile.ZipFile(path) as zf, open(path, "rb") as raw:
        infos = zf.infolist()
        pkl = [i for i in infos if i.filename.endswith("/data.pkl") or i.filename == "data.pkl"]
        if not pkl:
            return []
        info = storage_info(zf.read(pkl[0]))
        for i in infos:
            parts = i.filename.split("/")
            if len(parts) < 2 or parts[-2] != "data" or i.compress_type != zipfile.ZIP_STORED:
                continue
            key = parts[-1]
            dtype, size, role = info.get(key, ("u8", 1, "other"))
            raw.seek(i.header_offset)
            local = raw.read(30)
            name_len, extra_len = struct.unpack_from("<HH", local, 26)
            out.append(TensorRange(key, role, dtype, size, i.header_offset + 30 + name_len + extra_len,
                                   i.file_size))
    return out


def tensor_ranges(path: Path, data: bytes) -> list[TensorRange]:
    if len(data) < SMALL_FILE:
        return []
    if path.suffix == ".safetensors":
        return parse_safetensors(data)
    if data[:4] == b"PK\x03\x04":
        return parse_torch_zip(path)
    return []


def versions(series: Path) -> list[Path]:
    dirs = [p for p in series.iterdir() if p.is_dir() and p.name.split("-")[-1].isdigit()]
    return sorted(dirs, key=lambda p: int(p.name.split("-")[-1]))


@dataclass
class Version:
    name: str
    files: dict[str, bytes]  # relative path -> content
    pieces: list[Piece]
    rest: bytes  # every non-tensor byte of the version, concatenated (files in path order)

    @property
    def logical(self) -> int:
        return sum(len(b) for b in self.files.values())

    def view(self, p: Piece) -> memoryview:
        return memoryview(self.files[p.file])[p.offset:p.offset + p.nbytes]


def cut(tr: TensorRange, file: str, piece_bytes: int) -> list[Piece]:
    step = max(tr.itemsize, piece_bytes - piece_bytes % tr.itemsize)
    return [Piece(file, tr.key, tr.role, tr.dtype, tr.itemsize, k, tr.offset + lo,
                  min(step, tr.nbytes - lo), tr.nbytes)
            for k, lo in enumerate(range(0, tr.nbytes, step))]


def load_version(vdir: Path, piece_bytes: int) -> Version:
    files: dict[str, bytes] = {}
    pieces: list[Piece] = []
    rest: list[bytes] = []
    for f in sorted(p for p in vdir.rglob("*") if p.is_file()):
        rel = str(f.relative_to(vdir))
        data = f.read_bytes()
        files[rel] = data
        ranges = sorted(tensor_ranges(f, data), key=lambda t: t.offset)
        pos = 0
        for tr in ranges:
            rest.append(data[pos:tr.offset])
            pos = tr.offset + tr.nbytes
            if tr.nbytes:
                pieces.extend(cut(tr, rel, piece_bytes))
        rest.append(data[pos:])
    return Version(vdir.name, files, pieces, b"".join(rest))
