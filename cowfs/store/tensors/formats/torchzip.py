"""torch.save zip archives (the default format since torch 1.6).

The archive holds `PREFIX/data.pkl` (the pickled object, tensors replaced by persistent
ids), `PREFIX/data/KEY` (one stored entry per storage, its raw bytes, 64-byte aligned by an
"FB" extra field), and small records (`version`, `byteorder`, ...). PREFIX is the file's
stem when it was saved ("archive" for streams) and takes no part in names.

One region per storage: offset = local header + 30 + name length + extra length; length =
the entry's size. The dtype comes from data.pkl, read with `_pickle.run` (no unpickling):
each storage is `BINPERSID` of ('storage', GLOBAL torch <X>Storage, KEY, location, numel).
A typed <X>Storage names the dtype and numel counts elements; torch.storage.UntypedStorage
(torch >= 2.1 for dtypes without a legacy class: uint16/32/64, float8...) counts bytes and
the dtype is the `GLOBAL torch <dtype>` argument of the `_rebuild_tensor_v3` call that
wraps it; otherwise "U8".

Name = the state-dict path where the storage is first met in the pickle, keys joined by
"." ("model.layers.0.weight", "state.0.exp_avg", "param_groups.0.params.3" ...), see
`_pickle.walk`; "data/KEY" for a storage pickled at the root (torch.save(tensor)) or whose path is over
MAX_NAME characters; a
"#2", "#3" suffix if two storages would share a name. Successive saves of one structure
give the same names. Shape: the tensor's size when exactly one tensor views the whole
storage contiguously from offset 0; else None."""
from __future__ import annotations

from dataclasses import dataclass, field

from . import _pickle, _zip
from ._base import ELEM_SIZE, TORCH_DTYPE, TORCH_STORAGE_DTYPE, Malformed, Reader, TensorRegion, int_tuple, prod

MAX_SMALL_RECORD = 64
MAX_NAME = 1024


@dataclass
class Storage:
    key: str
    kind: str                       # a dtype name, "untyped" or "unknown"
    numel: int
    path: tuple[str, ...]
    views: list[tuple[object, object, object]] = field(default_factory=list)
    tensor_dtypes: set[str] = field(default_factory=set)


def is_torch_archive(archive: _zip.Archive) -> bool:
    return _pickle_entry(archive) is not None


def _pickle_entry(archive: _zip.Archive) -> _zip.Entry | None:
    found = [e for n, e in archive.entries.items()
             if n.endswith("/data.pkl") and n.count("/") == 1]
    return found[0] if len(found) == 1 else None


def parse(reader: Reader) -> list[TensorRegion]:
    """Regions of a file that is exactly one torch.save archive."""
    archive = _zip.read_archive(reader, reader.size)
    if archive.base != 0:
        raise Malformed("torchzip: bytes before the archive")
    return archive_regions(reader, archive)


def archive_regions(reader: Reader, archive: _zip.Archive) -> list[TensorRegion]:
    """Regions of one torch.save archive lying at [archive.base, archive.end)."""
    pkl = _pickle_entry(archive)
    if pkl is None:
        raise Malformed("torchzip: no PREFIX/data.pkl")
    prefix = pkl.name[: -len("data.pkl")]
    order = archive.entries.get(prefix + "byteorder")
    if order is not None and _small_record(reader, archive, order) != b"little":
        raise Malformed("torchzip: not little-endian")
    pkl = _stored(reader, archive, pkl)
    if pkl.size > _pickle.MAX_PICKLE:
        raise Malformed("torchzip: data.pkl too large")
    found = storages(_pickle.run(reader(pkl.data, pkl.size)))
    out: list[TensorRegion] = []
    used: dict[str, int] = {}
    for st in found.values():
        entry = archive.entries.get(f"{prefix}data/{st.key}")
        if entry is None:
            raise Malformed(f"torchzip: storage {st.key} has no data/{st.key} record")
        entry = _stored(reader, archive, entry)
        dtype, shape = dtype_and_shape(st, entry.size)
        name = ".".join(st.path)
        if not name or len(name) > MAX_NAME:
            name = f"data/{st.key}"
        used[name] = used.get(name, 0) + 1
        if used[name] > 1:
            name = f"{name}#{used[name]}"
        if entry.size:
            out.append(TensorRegion(name, dtype, ELEM_SIZE[dtype], shape, entry.data,
                                    entry.size))
    return out


def _stored(reader: Reader, archive: _zip.Archive, entry: _zip.Entry) -> _zip.Entry:
    if entry.method != 0 or entry.comp_size != entry.size:
        raise Malformed(f"torchzip: {entry.name!r} is compressed")
    return _zip.locate(reader, archive, entry)


def _small_record(reader: Reader, archive: _zip.Archive, entry: _zip.Entry) -> bytes:
    entry = _stored(reader, archive, entry)
    if entry.size > MAX_SMALL_RECORD:
        raise Malformed(f"torchzip: {entry.name!r} too large")
    return reader(entry.data, entry.size)


def storages(root: object) -> dict[str, Storage]:
    """Storage key -> what the pickle says of it, in the order the walk meets them."""
    found: dict[str, Storage] = {}

    def record(pid: object, path: tuple[str, ...]) -> Storage | None:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            return None
        _, cls, key, _location, numel = pid
        if not isinstance(key, str) or type(numel) is not int or numel < 0:
            raise Malformed("torchzip: bad storage persistent id")
        kind = "unknown"
        if isinstance(cls, _pickle.Global):
            if cls.module == "torch" and cls.name in TORCH_STORAGE_DTYPE:
                kind = TORCH_STORAGE_DTYPE[cls.name]
            elif cls.name == "UntypedStorage" and cls.module in ("torch", "torch.storage"):
                kind = "untyped"
        st = found.get(key)
        if st is None:
            st = found[key] = Storage(key, kind, numel, path)
        elif (st.kind, st.numel) != (kind, numel):
            raise Malformed(f"torchzip: storage {key} described two ways")
        return st

    for path, value in _pickle.walk(root):
        if isinstance(value, _pickle.PersId):
            record(value.pid, path)
        elif (isinstance(value, _pickle.Call) and isinstance(value.func, _pickle.Global)
              and value.func.module == "torch._utils"
              and value.func.name.startswith("_rebuild")
              and isinstance(value.args, tuple) and len(value.args) >= 4
              and isinstance(value.args[0], _pickle.PersId)):
            st = record(value.args[0].pid, path)
            if st is None:
                continue
            st.views.append(value.args[1:4])
            dt = value.args[6] if len(value.args) > 6 else None
            if (value.func.name == "_rebuild_tensor_v3" and isinstance(dt, _pickle.Global)
                    and dt.module == "torch"):
                st.tensor_dtypes.add(TORCH_DTYPE.get(dt.name, "U8"))
    return found


def dtype_and_shape(st: Storage, nbytes: int) -> tuple[str, tuple[int, ...] | None]:
    if st.kind in ELEM_SIZE:
        dtype = st.kind
        if st.numel * ELEM_SIZE[dtype] != nbytes:
            raise Malformed(f"torchzip: storage {st.key}: numel does not match its record")
    else:
        if st.kind == "untyped" and st.numel != nbytes:
            raise Malformed(f"torchzip: storage {st.key}: nbytes does not match its record")
        dtype = "U8"
        if len(st.tensor_dtypes) == 1:
            (dt,) = st.tensor_dtypes
            if nbytes % ELEM_SIZE[dt] == 0:
                dtype = dt
    if len(st.views) != 1:
        return dtype, None
    offset, size, stride = st.views[0]
    size_t, stride_t = int_tuple(size), int_tuple(stride)
    if offset != 0 or size_t is None or stride_t is None or len(size_t) != len(stride_t):
        return dtype, None
    expect = 1
    for d, s in zip(reversed(size_t), reversed(stride_t)):
        if d > 1 and s != expect:
            return dtype, None
        expect *= d
    if prod(size_t) * ELEM_SIZE[dtype] != nbytes:
        return dtype, None
    return dtype, size_t
