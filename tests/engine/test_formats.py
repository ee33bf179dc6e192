"""cowfs.store.tensors.formats: tensor regions of real checkpoint files (safetensors, torch.save,
numpy, torch.distributed.checkpoint), made here with torch/safetensors/numpy; malformed,
truncated and fuzzed input gives None and never an exception; the package imports no torch."""
from __future__ import annotations

import io
import os
import struct
import subprocess
import sys
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from cowfs.store.tensors.formats import TensorRegion, distcp_regions, regions
from cowfs.store.tensors.formats._base import ELEM_SIZE

REPO = Path(__file__).resolve().parents[2]
FUZZ = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


# ---------------------------------------------------------------- helpers

def parse(data: bytes, hint: str = "file") -> list[TensorRegion] | None:
    return regions(data[:65536], len(data), lambda o, n: data[o:o + n], hint)


def parse_path(path: Path) -> list[TensorRegion] | None:
    return parse(path.read_bytes(), str(path))


def assert_valid(regs: list[TensorRegion] | None, size: int) -> None:
    assert regs is not None
    end = 0
    for r in regs:
        assert isinstance(r, TensorRegion)
        assert r.length > 0 and r.offset >= end and r.offset + r.length <= size
        assert r.elem_size == ELEM_SIZE[r.dtype] and r.length % r.elem_size == 0
        if r.shape is not None:
            assert int(np.prod(r.shape)) * r.elem_size == r.length
        end = r.offset + r.length
    assert len({r.name for r in regs}) == len(regs)


def storage_bytes(t: torch.Tensor) -> bytes:
    """The bytes of the whole storage under `t` (what torch.save writes for it)."""
    return torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage()).numpy().tobytes()


def by_name(regs: list[TensorRegion]) -> dict[str, TensorRegion]:
    return {r.name: r for r in regs}


def at(data: bytes, r: TensorRegion) -> bytes:
    return data[r.offset:r.offset + r.length]


def torch_bytes(obj: object, **kw: object) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf, **kw)
    return buf.getvalue()


def make_archive(pkl: bytes, records: dict[str, bytes], method: int = zipfile.ZIP_STORED) -> bytes:
    """A hand-made torch.save-like zip: archive/data.pkl + archive/<records> ("/name": name)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=method) as z:
        z.writestr("archive/data.pkl", pkl)
        for name, data in records.items():
            z.writestr(name[1:] if name.startswith("/") else "archive/" + name, data)
    return buf.getvalue()


def small_model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Embedding(11, 4), torch.nn.Linear(4, 6),
                               torch.nn.LayerNorm(6), torch.nn.Linear(6, 3, bias=False))


def trained(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = small_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(seed + 1):
        model(torch.randint(0, 11, (5,))).sum().backward()
        opt.step()
        opt.zero_grad()
    return model, opt


# ---------------------------------------------------------------- safetensors

SAFE_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
               "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32,
               "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool,
               "U16": torch.uint16, "F8_E4M3": torch.float8_e4m3fn,
               "F8_E5M2": torch.float8_e5m2}


def safetensors_file(path: Path, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for i, (name, dt) in enumerate(SAFE_DTYPES.items()):
        shape = (3, i + 1) if i % 2 else (i + 2,)
        tensors[f"t.{name.lower()}"] = (torch.randn(shape, generator=g) * 50).to(dt)
    tensors["empty"] = torch.zeros((0, 4))
    tensors["scalar"] = torch.tensor(seed + 1.5)
    save_file(tensors, str(path), metadata={"step": str(seed)})
    return tensors


def test_safetensors_regions_are_the_tensors(tmp_path: Path) -> None:
    tensors = safetensors_file(tmp_path / "a.safetensors", 1)
    data = (tmp_path / "a.safetensors").read_bytes()
    regs = parse(data, "a.safetensors")
    assert_valid(regs, len(data))
    named = by_name(regs)
    assert set(named) == set(tensors) - {"empty"}  # empty tensors have no bytes, no region
    for name, t in tensors.items():
        if t.numel() == 0:
            continue
        r = named[name]
        assert at(data, r) == storage_bytes(t.contiguous())
        assert r.shape == tuple(t.shape)
        assert r.dtype == {v: k for k, v in SAFE_DTYPES.items()}[t.dtype]


def test_safetensors_names_and_layout_stable_across_saves(tmp_path: Path) -> None:
    safetensors_file(tmp_path / "a.safetensors", 1)
    safetensors_file(tmp_path / "b.safetensors", 2)
    a, b = parse_path(tmp_path / "a.safetensors"), parse_path(tmp_path / "b.safetensors")
    assert a is not None and b is not None
    assert [(r.name, r.dtype, r.shape) for r in a] == [(r.name, r.dtype, r.shape) for r in b]


def safetensors_raw(header: dict, data: bytes) -> bytes:
    h = __import__("json").dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data


@pytest.mark.parametrize("header", [
    {"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 32]}},          # past the end
    {"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 12]}},          # wrong length
    {"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
     "y": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}},          # overlap
    {"x": {"dtype": "Q9", "shape": [2], "data_offsets": [0, 8]}},            # unknown dtype
    {"x": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}},          # negative dim
    {"x": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}},           # reversed
    {"x": [1, 2]},                                                           # not an object
])
def test_safetensors_bad_headers(header: dict) -> None:
    assert parse(safetensors_raw(header, bytes(16)), "x.safetensors") is None


def test_safetensors_header_length_past_end_or_not_json() -> None:
    assert parse(struct.pack("<Q", 1000) + b'{"a": 1}', "x.safetensors") is None
    assert parse(struct.pack("<Q", 6) + b"{nope}" + bytes(8), "x.safetensors") is None
    assert parse(struct.pack("<Q", 4) + b'{"a"' + bytes(8), "x.safetensors") is None


# ---------------------------------------------------------------- torch.save

def test_torch_model_state_dict(tmp_path: Path) -> None:
    model, _ = trained(0)
    model[1].to(torch.bfloat16)
    sd = model.state_dict()
    torch.save(sd, tmp_path / "model.pt")
    data = (tmp_path / "model.pt").read_bytes()
    regs = parse(data, "model.pt")
    assert_valid(regs, len(data))
    named = by_name(regs)
    assert list(named) == list(sd)
    for key, t in sd.items():
        r = named[key]
        assert at(data, r) == storage_bytes(t)
        assert r.shape == tuple(t.shape)
        assert r.dtype == ("BF16" if t.dtype == torch.bfloat16 else "F32")
        assert r.offset % 64 == 0  # torch aligns storages to 64 bytes


def test_torch_optimizer_state_dict(tmp_path: Path) -> None:
    _, opt = trained(1)
    sd = opt.state_dict()
    torch.save(sd, tmp_path / "opt.pt")
    data = (tmp_path / "opt.pt").read_bytes()
    regs = parse(data, "opt.pt")
    assert_valid(regs, len(data))
    named = by_name(regs)
    expect = {f"state.{i}.{k}": t for i, s in sd["state"].items() for k, t in s.items()}
    assert set(named) == set(expect)
    for name, t in expect.items():
        assert at(data, named[name]) == storage_bytes(t)
        assert named[name].dtype == "F32" and named[name].shape == tuple(t.shape)


def test_torch_names_stable_across_saves(tmp_path: Path) -> None:
    out = []
    for seed in (2, 3):
        model, opt = trained(seed)
        data = torch_bytes({"model": model.state_dict(), "optim": opt.state_dict(), "step": seed})
        regs = parse(data, f"ckpt-{seed}.pt")
        assert_valid(regs, len(data))
        out.append([(r.name, r.dtype, r.shape, r.length) for r in regs])
    assert out[0] == out[1]
    assert ("model.1.weight", "F32", (6, 4), 96) in out[0]
    assert any(n == "optim.state.0.exp_avg_sq" for n, *_ in out[0])


def test_torch_shared_storage_is_one_region() -> None:
    base = torch.arange(12, dtype=torch.float32)
    obj = {"view": base[2:7], "base": base, "t": base.view(3, 4).t(), "other": torch.ones(3)}
    data = torch_bytes(obj)
    regs = parse(data)
    assert_valid(regs, len(data))
    assert [r.name for r in regs] == ["view", "other"]  # first path that meets the storage
    named = by_name(regs)
    assert at(data, named["view"]) == storage_bytes(base)
    assert named["view"].shape is None and named["view"].dtype == "F32"
    assert named["other"].shape == (3,)


@pytest.mark.parametrize("dtype,name", [
    (torch.float64, "F64"), (torch.float16, "F16"), (torch.bfloat16, "BF16"),
    (torch.int64, "I64"), (torch.int32, "I32"), (torch.int16, "I16"), (torch.int8, "I8"),
    (torch.uint8, "U8"), (torch.bool, "BOOL"), (torch.complex64, "C64"),
    (torch.uint16, "U16"), (torch.uint32, "U32"), (torch.uint64, "U64"),
    (torch.float8_e4m3fn, "F8_E4M3"), (torch.float8_e5m2, "F8_E5M2"),
])
def test_torch_dtypes(dtype: torch.dtype, name: str) -> None:
    t = (torch.arange(24) % 7).to(dtype).reshape(2, 3, 4)
    data = torch_bytes({"x": t})
    regs = parse(data)
    assert_valid(regs, len(data))
    assert [(r.name, r.dtype, r.shape) for r in regs] == [("x", name, (2, 3, 4))]
    assert at(data, regs[0]) == storage_bytes(t)


@pytest.mark.parametrize("protocol", [1, 2, 3, 4, 5])
def test_torch_pickle_protocols(protocol: int) -> None:
    obj = {"a": {"b": [torch.ones(2), (torch.zeros(3, dtype=torch.int64),)]},
           "p": torch.nn.Parameter(torch.randn(2, 2)), 7: torch.tensor(1.0)}
    data = torch_bytes(obj, pickle_protocol=protocol)
    regs = parse(data)
    assert_valid(regs, len(data))
    assert [(r.name, r.dtype) for r in regs] == [
        ("a.b.0", "F32"), ("a.b.1.0", "I64"), ("p", "F32"), ("7", "F32")]


class Wrapped:  # pickled by reduce (positional args) and by state
    def __init__(self, w: torch.Tensor) -> None:
        self.w = w


class Reduced:
    def __init__(self, a: torch.Tensor, b: torch.Tensor) -> None:
        self.a, self.b = a, b

    def __reduce__(self):
        return (Reduced, (self.a, self.b))


def test_torch_user_objects_bare_tensor_and_name_collisions() -> None:
    data = torch_bytes({"obj": Wrapped(torch.ones(2)), "red": Reduced(torch.ones(1), torch.ones(3)),
                        "a.b": torch.ones(4), "a": {"b": torch.ones(5)}})
    regs = parse(data)
    assert_valid(regs, len(data))
    assert [r.name for r in regs] == ["obj.w", "red.0", "red.1", "a.b", "a.b#2"]
    bare = torch_bytes(torch.arange(5))
    assert [(r.name, r.dtype, r.shape) for r in parse(bare)] == [("data/0", "I64", (5,))]


def test_deep_nesting_and_long_names() -> None:
    deep = b"\x80\x02" + b"]" * 5000 + b"a" * 4999 + b"."  # lists nested 5000 deep
    assert parse(make_archive(deep, {})) is None  # refused, not a RecursionError or a hang
    assert parse(make_archive(deep.replace(b"]" * 5000, b"]" * 50, 1).replace(b"a" * 4999, b"a" * 49), {})) == []
    data = torch_bytes({"k" * 5000: torch.ones(2), "short": torch.ones(3)})
    assert [r.name for r in parse(data)] == ["data/0", "short"]


def test_torch_empty_tensors_have_no_region() -> None:
    data = torch_bytes({"e": torch.zeros(0, 3), "x": torch.ones(2)})
    assert [r.name for r in parse(data)] == ["x"]


def test_torch_reads_headers_not_data() -> None:
    big = torch.zeros(4 << 20, dtype=torch.float32)  # 16 MiB
    data = torch_bytes({"big": big, "small": torch.ones(3)})
    asked = []

    def read(o: int, n: int) -> bytes:
        asked.append(n)
        return data[o:o + n]

    regs = regions(data[:65536], len(data), read, "x.pt")
    assert_valid(regs, len(data))
    assert sum(asked) < 64 << 10 and len(asked) < 20


def test_torch_many_tensors_fast() -> None:
    import time
    sd = {f"layers.{i}.w": torch.ones(1) for i in range(3000)}
    data = torch_bytes(sd)
    t0 = time.perf_counter()
    regs = parse(data)
    assert time.perf_counter() - t0 < 5
    assert [r.name for r in regs] == list(sd)


def test_zip64_extra_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    """Central-directory sizes/offsets in zip64 extra fields (what a > 4 GiB checkpoint has)."""
    t = torch.arange(6, dtype=torch.float32)
    pkl = zipfile.ZipFile(io.BytesIO(torch_bytes({"t": t}))).read("archive/data.pkl")
    monkeypatch.setattr(zipfile, "ZIP64_LIMIT", 16)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("archive/data.pkl", pkl)
        with z.open("archive/data/0", "w", force_zip64=True) as f:
            f.write(storage_bytes(t))
    data = buf.getvalue()
    assert b"PK\x06\x06" in data
    regs = parse(data)
    assert [(r.name, r.shape) for r in regs] == [("t", (6,))]
    assert at(data, regs[0]) == storage_bytes(t)


# ---------------------------------------------------------------- malformed torch archives

def real_pkl_and_record() -> tuple[bytes, bytes]:
    z = zipfile.ZipFile(io.BytesIO(torch_bytes({"t": torch.arange(4, dtype=torch.int32)})))
    return z.read("archive/data.pkl"), z.read("archive/data/0")


def test_handmade_archive_parses() -> None:
    pkl, rec = real_pkl_and_record()
    data = make_archive(pkl, {"data/0": rec, "byteorder": b"little"})
    assert [(r.name, r.dtype) for r in parse(data)] == [("t", "I32")]


@pytest.mark.parametrize("case", [
    "compressed", "missing-record", "short-record", "big-endian", "next-buffer",
    "bad-opcode", "build-on-list", "empty", "unbalanced-mark", "no-stop", "two-pickles",
    "pid-wrong-numel",
])
def test_malformed_torch_archives(case: str) -> None:
    pkl, rec = real_pkl_and_record()
    records = {"data/0": rec}
    method = zipfile.ZIP_STORED
    if case == "compressed":
        method = zipfile.ZIP_DEFLATED
    elif case == "missing-record":
        records = {"data/1": rec}
    elif case == "short-record":
        records = {"data/0": rec[:-4]}
    elif case == "big-endian":
        records["byteorder"] = b"big"
    elif case == "two-pickles":
        records["/other/data.pkl"] = pkl
    else:
        pkl = {"next-buffer": b"\x80\x05\x97.", "bad-opcode": b"\x80\x02\xff.",
               "build-on-list": b"\x80\x02]K\x01b.", "empty": b"", "unbalanced-mark": b"(.",
               "no-stop": pkl[:-1], "pid-wrong-numel": pkl.replace(b"K\x04t", b"K\x05t")}[case]
        assert case != "pid-wrong-numel" or pkl != real_pkl_and_record()[0]
    assert parse(make_archive(pkl, records, method)) is None


def test_odd_but_valid_pickles() -> None:
    """INST/OBJ/EXT opcodes, text persistent ids and a pid that is not a storage are read
    without failing; what is not a storage is not a region."""
    pkl, rec = real_pkl_and_record()
    odd = (b"("                                        # MARK for the final LIST
           b"(K\x01ibuiltins\nobject\n"               # INST
           b"(cbuiltins\nobject\nK\x02o"              # OBJ
           b"\x82\x01"                                 # EXT1
           b"Pnot-a-storage\n"                         # PERSID (text)
           b"(X\x03\x00\x00\x00notK\x01K\x02tQ"        # BINPERSID of a non-storage tuple
           b"l.")                                       # LIST, STOP
    assert parse(make_archive(odd, {"data/0": rec})) == []
    assert parse(make_archive(pkl, {"data/0": rec, "data/9": b"zz"})) is not None


@FUZZ
@given(st.binary(max_size=200))
def test_fuzz_pickle_bytes(pkl: bytes) -> None:
    _, rec = real_pkl_and_record()
    data = make_archive(pkl, {"data/0": rec})
    out = parse(data)
    assert out is None or (assert_valid(out, len(data)) is None)


# ---------------------------------------------------------------- numpy

@pytest.mark.parametrize("dtype,name", [
    (np.float64, "F64"), (np.float32, "F32"), (np.float16, "F16"), (np.int64, "I64"),
    (np.int32, "I32"), (np.int16, "I16"), (np.int8, "I8"), (np.uint8, "U8"),
    (np.uint16, "U16"), (np.uint32, "U32"), (np.uint64, "U64"), (np.bool_, "BOOL"),
    (np.complex64, "C64"),
])
def test_npy_dtypes(dtype: type, name: str) -> None:
    a = (np.arange(30) % 5).astype(dtype).reshape(5, 6)
    buf = io.BytesIO()
    np.save(buf, a)
    data = buf.getvalue()
    regs = parse(data, "x.npy")
    assert_valid(regs, len(data))
    assert [(r.name, r.dtype, r.shape) for r in regs] == [("array", name, (5, 6))]
    assert at(data, regs[0]) == a.tobytes()


@pytest.mark.parametrize("version", [(1, 0), (2, 0), (3, 0)])
def test_npy_versions_and_fortran_order(version: tuple[int, int]) -> None:
    a = np.asfortranarray(np.arange(12, dtype=np.float32).reshape(3, 4))
    buf = io.BytesIO()
    np.lib.format.write_array(buf, a, version=version)
    data = buf.getvalue()
    regs = parse(data)
    assert [(r.dtype, r.shape) for r in regs] == [("F32", (4, 3))]  # bytes are a C (4, 3)
    assert at(data, regs[0]) == a.T.tobytes()


@pytest.mark.parametrize("arr", [
    np.arange(4, dtype=">f4"), np.array([1, "a"], dtype=object),
    np.zeros(3, dtype=[("a", "<f4"), ("b", "<i2")]), np.array(["ab", "cd"]),
    np.zeros(2, dtype="datetime64[s]"),
])
def test_npy_unsupported_dtypes(arr: np.ndarray) -> None:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=True)
    assert parse(buf.getvalue(), "x.npy") is None


def test_npy_scalar_and_empty() -> None:
    buf = io.BytesIO()
    np.save(buf, np.float32(2.5))
    assert [(r.shape, r.length) for r in parse(buf.getvalue())] == [((), 4)]
    buf = io.BytesIO()
    np.save(buf, np.zeros((0, 3)))
    assert parse(buf.getvalue()) == []


def test_npz() -> None:
    arrays = {"w": np.ones((2, 3), np.float32), "idx": np.arange(5)}
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    data = buf.getvalue()
    regs = parse(data, "x.npz")
    assert_valid(regs, len(data))
    assert {r.name: at(data, r) for r in regs} == {k: v.tobytes() for k, v in arrays.items()}
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    assert parse(buf.getvalue(), "x.npz") is None


# ---------------------------------------------------------------- torch.distributed.checkpoint

def dcp_save(path: Path, seed: int) -> dict[str, torch.Tensor]:
    import torch.distributed.checkpoint as dcp
    model, opt = trained(seed)
    sd = {"model": model.state_dict(), "optim": opt.state_dict()}
    flat = {f"model.{k}": v.clone() for k, v in sd["model"].items()}
    flat.update({f"optim.state.{i}.{k}": v.clone()
                 for i, s in sd["optim"]["state"].items() for k, v in s.items()})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(sd, checkpoint_id=str(path))
    return flat


@pytest.fixture(scope="module")
def dcp_dirs(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[Path, dict]]:
    base = tmp_path_factory.mktemp("dcp")
    return [(base / f"step{s}", dcp_save(base / f"step{s}", s)) for s in (1, 2)]


def test_dcp_by_content(dcp_dirs: list[tuple[Path, dict]]) -> None:
    names = []
    for path, flat in dcp_dirs:
        (distcp,) = path.glob("*.distcp")
        data = distcp.read_bytes()
        assert data[:4] == b"PK\x03\x04"
        regs = parse(data, str(distcp))
        assert_valid(regs, len(data))
        assert all(r.name.endswith(":data/0") for r in regs)
        assert sorted(at(data, r) for r in regs) == sorted(storage_bytes(t) for t in flat.values())
        names.append([(r.name, r.dtype, r.shape) for r in regs])
    assert names[0] == names[1]


def test_dcp_with_metadata(dcp_dirs: list[tuple[Path, dict]]) -> None:
    layouts = []
    for path, flat in dcp_dirs:
        (distcp,) = path.glob("*.distcp")
        data = distcp.read_bytes()
        meta = (path / ".metadata").read_bytes()
        regs = distcp_regions(data[:65536], len(data), lambda o, n: data[o:o + n], str(distcp), meta)
        assert_valid(regs, len(data))
        named = by_name(regs)
        assert set(named) == set(flat)
        for fqn, t in flat.items():
            assert at(data, named[fqn]) == storage_bytes(t)
            assert named[fqn].shape == tuple(t.shape) and named[fqn].dtype == "F32"
        by_offset = {r.offset: r.name for r in parse(data)}
        assert set(by_offset) == {r.offset for r in regs}
        layouts.append(sorted(by_offset.items()))
    assert [n for _, n in layouts[0]] == [n for _, n in layouts[1]]
    # metadata of another file, or not a Metadata pickle: None, never an exception
    assert distcp_regions(data[:65536], len(data), lambda o, n: data[o:o + n], "x.distcp", meta) is None
    assert distcp_regions(data[:65536], len(data), lambda o, n: data[o:o + n], str(distcp), b"\x80\x02}.") is None


def test_dcp_safetensors_serialization(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.filesystem import FileSystemWriter, SerializationFormat
    model, opt = trained(0)
    cases = {"model": {"model": model.state_dict()},
             "both": {"model": model.state_dict(), "optim": opt.state_dict()}}
    for case, sd in cases.items():
        flat = {f"model.{k}": storage_bytes(v) for k, v in sd["model"].items()}
        if "optim" in sd:
            flat.update({f"optim.state.{i}.{k}": storage_bytes(v)
                         for i, s in sd["optim"]["state"].items() for k, v in s.items()})
        writer = FileSystemWriter(str(tmp_path / case),
                                  serialization_format=SerializationFormat.SAFETENSORS)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp.save(sd, storage_writer=writer)
        (distcp,) = (tmp_path / case).glob("*.distcp")
        data = distcp.read_bytes()
        meta = (tmp_path / case / ".metadata").read_bytes()
        regs = distcp_regions(data[:65536], len(data), lambda o, n: data[o:o + n], str(distcp), meta)
        assert_valid(regs, len(data))
        assert {r.name: at(data, r) for r in regs} == flat
        by_content = parse(data, str(distcp))
        if case == "model":  # a plain safetensors file
            assert by_content == regs
        else:  # non-tensor items' archives, then a safetensors blob: needs the .metadata
            assert data[:4] == b"PK\x03\x04" and by_content is None


def test_dcp_truncated(dcp_dirs: list[tuple[Path, dict]]) -> None:
    path, _ = dcp_dirs[0]
    (distcp,) = path.glob("*.distcp")
    data = distcp.read_bytes()
    full = parse(data)
    for cut in list(range(0, len(data), 97)) + [len(data) - 1, len(data) - 22]:
        out = parse(data[:cut])
        if out is not None:  # only a cut exactly between two items leaves valid items
            assert_valid(out, cut)
            assert [(r.offset, r.length) for r in out] == [
                (r.offset, r.length) for r in full if r.offset + r.length <= cut][:len(out)]


# ---------------------------------------------------------------- truncation, fuzz, robustness

@pytest.fixture(scope="module")
def samples(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    tmp = tmp_path_factory.mktemp("samples")
    safetensors_file(tmp / "s.safetensors", 3)
    model, opt = trained(0)
    buf = io.BytesIO()
    np.save(buf, np.arange(40, dtype=np.float32).reshape(4, 10))
    return {"s.safetensors": (tmp / "s.safetensors").read_bytes(),
            "m.pt": torch_bytes({"model": model.state_dict(), "opt": opt.state_dict()}),
            "a.npy": buf.getvalue()}


def test_truncated_files_are_not_recognised(samples: dict[str, bytes]) -> None:
    for name, data in samples.items():
        assert_valid(parse(data, name), len(data))
        step = max(1, len(data) // 150)
        for cut in sorted(set(range(0, len(data), step)) | set(range(len(data) - 70, len(data)))):
            assert parse(data[:cut], name) is None, (name, cut)


@FUZZ
@given(st.binary(max_size=4096), st.sampled_from(["x.pt", "x.safetensors", "x.npy", "x.distcp", "x"]))
def test_fuzz_random_bytes(data: bytes, hint: str) -> None:
    out = parse(data, hint)
    assert out is None or (assert_valid(out, len(data)) is None)


@FUZZ
@given(st.data())
def test_fuzz_mutated_real_files(samples: dict[str, bytes], dcp_dirs: list[tuple[Path, dict]],
                                 draw: st.DataObject) -> None:
    files = dict(samples)
    files["x.distcp"] = next(dcp_dirs[0][0].glob("*.distcp")).read_bytes()
    name = draw.draw(st.sampled_from(sorted(files)))
    data = bytearray(files[name])
    for _ in range(draw.draw(st.integers(1, 8))):
        pos = draw.draw(st.integers(0, len(data) - 1))
        data[pos] = draw.draw(st.integers(0, 255))
    out = parse(bytes(data), name)
    assert out is None or (assert_valid(out, len(data)) is None)


@st.composite
def safetensors_cases(draw: st.DrawFn) -> tuple[dict, int]:
    """A header laid out tensor after tensor, each entry sometimes spoiled (bad dtype, a gap,
    a length off by a few bytes, an overlap), and a data length sometimes cut short."""
    header: dict = {}
    cursor = 0
    for i in range(draw(st.integers(0, 5))):
        dtype = draw(st.sampled_from(["F32", "BF16", "U8", "I64", "BOOL", "F4", "x"]))
        shape = draw(st.lists(st.integers(0, 4), max_size=3))
        begin = cursor + draw(st.sampled_from([0, 0, 0, 3, -2]))
        end = begin + int(np.prod(shape)) * ELEM_SIZE.get(dtype, 1) + draw(st.sampled_from([0, 0, 0, 1, -1]))
        header[f"t{i}"] = {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}
        cursor = max(cursor, end)
    if draw(st.booleans()):
        header["__metadata__"] = {"k": "v"}
    return header, max(0, cursor + draw(st.sampled_from([0, 0, 5, -1, -8])))


@FUZZ
@given(safetensors_cases())
def test_fuzz_safetensors_headers(case: tuple[dict, int]) -> None:
    header, data_len = case
    data = safetensors_raw(header, bytes(range(256)) * (data_len // 256) + bytes(range(data_len % 256)))
    out = parse(data, "x.safetensors")
    if out is None:
        return
    assert_valid(out, len(data))
    start = len(data) - data_len
    for r in out:  # every region is exactly what its header entry says
        e = header[r.name]
        assert (r.offset - start, r.offset - start + r.length) == tuple(e["data_offsets"])
        assert r.dtype == e["dtype"] and r.shape == tuple(e["shape"])


@pytest.mark.parametrize("prefix", [b"PK\x03\x04", b"\x93NUMPY", struct.pack("<Q", 20) + b"{"])
def test_magic_then_garbage(prefix: bytes) -> None:
    for n in (0, 10, 100, 5000):
        assert parse(prefix + os.urandom(n)) is None


def test_bad_arguments_and_failing_reads(samples: dict[str, bytes]) -> None:
    data = samples["m.pt"]

    def failing(o: int, n: int) -> bytes:
        raise OSError("I/O error")

    assert regions(data[:100], len(data), failing, "m.pt") is None
    assert regions(data[:100], len(data), lambda o, n: b"", "m.pt") is None  # short reads
    assert regions(None, len(data), lambda o, n: data[o:o + n], "m.pt") is None  # type: ignore[arg-type]
    assert regions(data, -1, lambda o, n: data[o:o + n], "m.pt") is None
    assert regions(b"", 0, lambda o, n: b"", "") is None
    # a short head is completed by reading; the extension does not change the result
    good = regions(b"", len(data), lambda o, n: data[o:o + n], "m.npy")
    assert good is not None and good == parse(data, "m.pt")


def test_no_torch_or_numpy_import(samples: dict[str, bytes], tmp_path: Path) -> None:
    for name, data in samples.items():
        (tmp_path / name).write_bytes(data)
    code = (
        "import sys, pathlib\n"
        "from cowfs.store.tensors.formats import regions\n"
        f"for p in sorted(pathlib.Path({str(tmp_path)!r}).iterdir()):\n"
        "    d = p.read_bytes()\n"
        "    assert regions(d[:65536], len(d), lambda o, n: d[o:o + n], str(p)), p\n"
        "print(sorted(m for m in ('torch', 'safetensors') if m in sys.modules))\n")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=REPO, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_formats_import_only_the_standard_library() -> None:
    """The parsers need neither torch nor numpy (the daemon imports numpy for its codecs,
    never torch)."""
    import ast

    pkg = REPO / "cowfs" / "store" / "formats"
    for path in pkg.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                assert node.module.split(".")[0] in sys.stdlib_module_names, (path.name, node.module)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    assert alias.name.split(".")[0] in sys.stdlib_module_names, (path.name, alias.name)


def test_pickle_machine_never_imports() -> None:
    """A pickle that would run os.system when unpickled is only read."""
    evil = b"\x80\x02cos\nsystem\nX\x04\x00\x00\x00exitK\x01\x86R."
    data = make_archive(evil, {})
    assert parse(data) == []
