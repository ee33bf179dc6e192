"""`cowfs restore TARGET PATH --snapshot NAME --into DIR` (cowfs/copy_out.py): a snapshot's
directory or file copied out through the mount, bitwise, with modes, times and symlinks, into
a new DIR made whole or not at all."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from cowfs import copy_out
from cowfs.errors import Exists
from tests.support.mountutil import cowfs, mounted
from tests.support.storeutil import assert_clean, data, new_store


def tree(root: Path) -> dict[str, tuple]:
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        rel = str(p.relative_to(root))
        if p.is_symlink():
            out[rel] = ("link", os.readlink(p))
        elif p.is_dir():
            out[rel] = ("dir", st.st_mode)
        else:
            out[rel] = ("file", st.st_mode, st.st_mtime_ns, p.read_bytes())
    return out


def test_a_snapshot_directory_is_copied_out_whole(tmp_path):
    store = new_store(tmp_path / "s")
    with mounted(store, tmp_path / "m") as m:
        ck = m / "run1" / "checkpoint-5"
        (ck / "sub").mkdir(parents=True)
        (ck / "model.safetensors").write_bytes(data(3 << 20, 1))
        (ck / "sub" / "opt.pt").write_bytes(data(1 << 20, 2))
        (ck / "sub" / "opt.pt").chmod(0o600)
        (ck / "latest").symlink_to("model.safetensors")
        cowfs("snapshot", "create", str(m), "s1")
        expect = tree(ck)
        (ck / "model.safetensors").write_bytes(b"changed since")
        out = cowfs("restore", str(m), "/run1/checkpoint-5", "--snapshot", "s1", "--into",
                    str(tmp_path / "restored")).stdout.decode()
        assert "2 files" in out
        assert tree(tmp_path / "restored") == expect
        # one file too; DIR must not exist; --into needs a snapshot
        cowfs("restore", str(m), "/run1/checkpoint-5/sub/opt.pt", "--snapshot", "s1", "--into", str(tmp_path / "one"))
        assert (tmp_path / "one").read_bytes() == data(1 << 20, 2)
        for args, said in ((("--snapshot", "s1", "--into", str(tmp_path / "one")), "exists already"),
                           (("--generation", "2", "--into", str(tmp_path / "x")), "--snapshot"),
                           (("--snapshot", "nope", "--into", str(tmp_path / "x")), "not in snapshot nope")):
            r = cowfs("restore", str(m), "/run1/checkpoint-5", *args, check=False)
            assert r.returncode == 2 and said in r.stderr.decode() and r.stderr.decode().count("\n") == 1, r.stderr
        assert not (tmp_path / "x").exists()
    r = cowfs("restore", str(store), "/run1", "--snapshot", "s1", "--into", str(tmp_path / "x"), check=False)
    assert r.returncode == 2 and "mount it first" in r.stderr.decode()
    assert_clean(store)


def test_a_copy_cut_short_leaves_nothing_and_its_leftover_goes_next_time(tmp_path, monkeypatch):
    store = new_store(tmp_path / "s")
    with mounted(store, tmp_path / "m") as m:
        (m / "d").mkdir()
        for k in range(3):
            (m / "d" / f"f{k}").write_bytes(data(1 << 20, k))
        cowfs("snapshot", "create", str(m), "s1")
        real, calls = copy_out._copy_file, []

        def failing(src: Path, dest: Path, done: copy_out.Copied) -> None:
            calls.append(src)
            if len(calls) == 2:
                raise OSError(5, "Input/output error", str(src))  # as a damaged chunk's read fails
            real(src, dest, done)

        monkeypatch.setattr(copy_out, "_copy_file", failing)
        with pytest.raises(OSError):
            copy_out.copy_out(m, "s1", "/d", tmp_path / "out")
        assert sorted(p.name for p in tmp_path.iterdir()) == ["m", "s"]  # no DIR, no partial copy
        monkeypatch.setattr(copy_out, "_copy_file", real)
        (tmp_path / ".out.cowfs-restore-0badf00d").mkdir()  # as a restore killed before its rename leaves
        (tmp_path / ".out.cowfs-restore-0badf00d" / "f0").write_bytes(b"partial")
        done = copy_out.copy_out(m, "s1", "/d", tmp_path / "out")
        assert done.files == 3 and sorted(p.name for p in tmp_path.iterdir()) == ["m", "out", "s"]
        with pytest.raises(Exists):
            copy_out.copy_out(m, "s1", "/d", tmp_path / "out")
    assert_clean(store)
