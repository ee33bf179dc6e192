"""The issue-33 scaling part of the benchmark on made-up runs (tools/bench/scalingreport.py):
GB/s, ratios, CPU per GiB and busy cores per part and stream count, every target judged (or
"not judged here" off a 16-core tmpfs machine), the tables, and the part's options. And,
without a mount, that its stream workers fail loudly when a file reads back wrong."""
from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import pytest

from tools.bench.scaling import CowfsMount, Streams, Window
from tools.bench.scalingreport import (GIB, MIB, options_from_args, parse_size, parse_streams, section, spread,
                                       summarize, table, targets, thread_table)


def _run(part: str, s: int, rep: int, arm: str, gbps: float, daemon_s_per_gib: float | None = None,
         busy_cores: float = 2.0, nbytes: int = GIB) -> dict[str, Any]:
    wall = nbytes / 1e9 / gbps
    return {"part": part, "S": s, "rep": rep, "arm": arm, "bytes": nbytes, "wall_s": wall,
            "busy_cpu_s": busy_cores * wall,
            "daemon_cpu_s": None if daemon_s_per_gib is None else daemon_s_per_gib * nbytes / GIB}


def _runs(fast: bool) -> list[dict[str, Any]]:
    """Two reps of every part; `fast`: cowfs meets every throughput target, else it misses them."""
    k = 1.0 if fast else 0.25
    out: list[dict[str, Any]] = []
    for rep in (0, 1):
        for s, w, r in ((1, 1.3, 2.6), (16, 3.2, 4.4)):
            out += [_run("write", s, rep, "cowfs", k * w + 0.1 * rep, 0.7), _run("write", s, rep, "plain", 10.0, None, 1.0),
                    _run("read", s, rep, "cowfs", k * r + 0.1 * rep, 0.3 + 0.06 * rep),
                    _run("read", s, rep, "plain", 20.0, None, 1.0)]
        out += [_run("torch-save", 1, rep, "cowfs", k * 1.0, 0.75, nbytes=GIB // 4),
                _run("torch-save", 1, rep, "plain", 1.2, nbytes=GIB // 4),
                _run("torch-load", 1, rep, "cowfs", k * 1.9, 0.38, nbytes=GIB // 4),
                _run("torch-load", 1, rep, "plain", 2.0, nbytes=GIB // 4)]
    return out


def _by_name(tgts: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {t["target"].split(": ", 1)[1]: t for t in tgts}


def test_rows_per_part_and_stream_count() -> None:
    rows = summarize(_runs(fast=True))
    assert [(r["part"], r["S"]) for r in rows] == [("write", 1), ("write", 16), ("read", 1), ("read", 16),
                                                   ("torch-save", 1), ("torch-load", 1)]
    w1 = rows[0]
    assert w1["cowfs_gbps"] == pytest.approx([1.3, 1.4]) and w1["plain_gbps"] == pytest.approx([10.0, 10.0])
    assert w1["ratio"] == pytest.approx([0.13, 0.14])
    assert w1["daemon_s_per_gib"] == pytest.approx([0.7, 0.7])
    assert w1["busy_cowfs"] == pytest.approx([2.0, 2.0]) and w1["busy_plain"] == pytest.approx([1.0, 1.0])
    assert w1["reps"] == 2
    assert rows[4]["ratio"] == pytest.approx([1.0 / 1.2, 1.0 / 1.2])


def test_every_target_met_on_a_16_core_tmpfs_machine() -> None:
    got = _by_name(targets(summarize(_runs(fast=True)), 16, "tmpfs"))
    assert len(got) == 8
    for name in ("16 streams write >= 3.0 GB/s", "16 streams cold-read >= 4.0 GB/s", "1 stream write >= 1.2 GB/s",
                 "1 stream cold-read >= 2.5 GB/s", "torch.load >= 0.9x the same on plain tmpfs",
                 "daemon CPU per GiB written <= 0.8 s", "daemon CPU per GiB read <= 0.4 s"):
        assert got[name]["met"] is True and got[name]["status"] == "MET", name
    save = got["torch.save >= 0.8x the same on plain tmpfs"]
    assert save["met"] is True and save["detail"] == "0.83 [0.83-0.83] (cowfs/plain GB/s) over 2 rep(s)"  # 1.0 / 1.2
    assert "1.35 [1.30-1.40] GB/s over 2 rep(s)" in got["1 stream write >= 1.2 GB/s"]["detail"]
    assert "worst 0.75 s/GiB (torch-save S=1" in got["daemon CPU per GiB written <= 0.8 s"]["detail"]
    assert "worst 0.38 s/GiB (torch-load S=1" in got["daemon CPU per GiB read <= 0.4 s"]["detail"]


def test_targets_missed_on_a_16_core_tmpfs_machine() -> None:
    got = _by_name(targets(summarize(_runs(fast=False)), 32, "tmpfs"))
    for name in ("16 streams write >= 3.0 GB/s", "16 streams cold-read >= 4.0 GB/s", "1 stream write >= 1.2 GB/s",
                 "1 stream cold-read >= 2.5 GB/s", "torch.save >= 0.8x the same on plain tmpfs",
                 "torch.load >= 0.9x the same on plain tmpfs"):
        assert got[name]["met"] is False and got[name]["status"] == "NOT MET", name


def test_machine_targets_not_judged_off_a_16_core_tmpfs_machine() -> None:
    for cpus, fs in ((2, "ext4"), (8, "tmpfs"), (64, "xfs")):
        got = _by_name(targets(summarize(_runs(fast=True)), cpus, fs))
        judged = {n: t for n, t in got.items() if not n.startswith("daemon CPU")}
        assert len(judged) == 6
        for t in judged.values():
            assert t["met"] is None and t["status"] == f"not judged here ({cpus} cores, {fs})"
            assert t["detail"].startswith("measured ")
        assert got["daemon CPU per GiB written <= 0.8 s"]["met"] is True  # judged on any machine


def test_cpu_targets_take_the_worst_row() -> None:
    runs = _runs(fast=True) + [_run("read", 4, 0, "cowfs", 2.0, 0.41), _run("read", 4, 0, "plain", 9.0)]
    t = _by_name(targets(summarize(runs), 2, "ext4"))["daemon CPU per GiB read <= 0.4 s"]
    assert t["met"] is False and t["status"] == "NOT MET" and "worst 0.41 s/GiB (read S=4, 0.41)" in t["detail"]
    assert "medians: read S=1 0.33, read S=4 0.41, read S=16 0.33, torch-load S=1 0.38" in t["detail"]


def test_missing_runs_are_not_measured() -> None:
    runs = [r for r in _runs(fast=True) if r["S"] == 1 and not r["part"].startswith("torch")]
    got = _by_name(targets(summarize(runs), 16, "tmpfs", torch_skipped=True))
    assert got["16 streams write >= 3.0 GB/s"] == {
        "target": "16-core machine, RAM-backed store: 16 streams write >= 3.0 GB/s", "met": None,
        "status": "not measured", "detail": "not measured: no run with 16 streams"}
    assert got["torch.save >= 0.8x the same on plain tmpfs"]["detail"] == "not measured: torch skipped (--torch-gib 0)"
    assert got["1 stream write >= 1.2 GB/s"]["met"] is True
    off = _by_name(targets(summarize(runs), 2, "ext4"))["16 streams cold-read >= 4.0 GB/s"]
    assert off["status"] == "not judged here (2 cores, ext4)" and off["met"] is None
    assert _by_name(targets([], 2, "ext4"))["daemon CPU per GiB written <= 0.8 s"]["status"] == "not measured"


def test_spread_and_table() -> None:
    assert spread([]) == "-" and spread([1.234]) == "1.23" and spread([3.0, 1.0, 2.0]) == "2.00 [1.00-3.00]"
    lines = table(summarize(_runs(fast=True)), "read")
    assert lines[2].startswith("| part | S | cowfs GB/s | plain GB/s | cowfs/plain | daemon CPU s/GiB |")
    assert lines[4:] == [
        "| read | 1 | 2.65 [2.60-2.70] | 20.00 [20.00-20.00] | 0.13 [0.13-0.14] | 0.33 [0.30-0.36] | 2.0 [2.0-2.0] | "
        "1.0 [1.0-1.0] | 2 |",
        "| read | 16 | 4.45 [4.40-4.50] | 20.00 [20.00-20.00] | 0.22 [0.22-0.23] | 0.33 [0.30-0.36] | 2.0 [2.0-2.0] | "
        "1.0 [1.0-1.0] | 2 |"]


def test_section_keeps_rows_and_targets_and_says_what_the_budget_skipped() -> None:
    sc = {"fs": "tmpfs on tmpfs (/x)", "fs_type": "tmpfs", "cpus": 16, "pyfuse3": "3.5.0+cowfs.gil1",
          "streams": [1, 16], "mib_per_stream": 1024,
          "reps": 2, "torch_gib": 0.25, "torch_bytes": GIB // 4, "workers": 16, "budget_s": 60.0, "elapsed_s": 75.0,
          "skipped": ["S=32"], "caches_dropped": True, "runs": _runs(fast=True)}
    results: dict[str, Any] = {"scaling": sc}
    md = section(results)
    assert len(sc["summary"]) == 6 and len(sc["targets"]) == 8
    assert "Budget of 60 s spent after 75 s; skipped: S=32." in md
    assert "--workers 16" in md and "a 0.25 GiB file per torch.save" in md and "pyfuse3 3.5.0+cowfs.gil1;" in md
    assert md.count("| part | S |") == 4 and md.count("- **MET**") == 8
    assert section({}) == "(the scaling part did not run)\n"


def _args(**kw: Any) -> argparse.Namespace:
    base = {"full": False, "streams": "1,4,8,16", "mib_per_stream": None, "reps": 2, "torch_gib": None,
            "workers": None, "scaling_writeback": "default", "tmpfs": False, "tmpfs_size": None, "budget_s": None}
    return argparse.Namespace(**{**base, **kw})


def test_options_quick_and_full() -> None:
    quick, full = options_from_args(_args()), options_from_args(_args(full=True))
    assert (quick.mib_per_stream, quick.torch_gib, quick.streams) == (256, 0.25, [1, 4, 8, 16])
    assert (full.mib_per_stream, full.torch_gib) == (1024, 4.0)
    own = options_from_args(_args(full=True, mib_per_stream=64, torch_gib=0.0, streams="1,2", tmpfs_size="3G"))
    assert (own.mib_per_stream, own.torch_gib, own.streams, own.tmpfs_bytes()) == (64, 0.0, [1, 2], 3 * GIB)
    assert full.tmpfs_bytes() == int(2 * (16 * GIB + 4 * GIB) * 1.25) + GIB  # both arms: the largest S, the torch file
    for bad in (_args(reps=0), _args(mib_per_stream=0), _args(torch_gib=-1.0), _args(streams="1,0"), _args(streams="")):
        with pytest.raises(ValueError):
            options_from_args(bad)
    assert parse_size("512M") == 512 * MIB and parse_size("24GiB") == 24 * GIB and parse_size("4096") == 4096
    assert parse_streams(" 1, 16 ") == [1, 16]


@pytest.mark.parametrize("writeback, flags", [("default", []), ("on", ["--writeback-cache"]),
                                              ("off", ["--no-writeback-cache"])])
def test_the_mount_takes_the_writeback_choice(monkeypatch: pytest.MonkeyPatch, writeback: str,
                                              flags: list[str]) -> None:
    import tools.bench.mounting

    seen: list[tuple[str, ...]] = []
    monkeypatch.setattr(tools.bench.mounting, "mount_store", lambda store, mnt, *extra: seen.append(extra) or 1)
    opts = options_from_args(_args(workers=16, scaling_writeback=writeback))
    CowfsMount(Path("s"), Path("m"), opts.workers, opts.writeback).mount()
    assert seen == [("--compact-idle", "off", "--workers", "16", *flags)]


def test_streams_fail_loudly_on_wrong_bytes(tmp_path: Path) -> None:
    """Two workers write, read back and verify; a byte changed on the way out is an error."""
    paths = [tmp_path / "a.bin", tmp_path / "b.bin"]
    with Streams(2, 2 * MIB) as streams:
        digests = streams.write(paths, [1, 2], Window(None))
        assert [p.stat().st_size for p in paths] == [2 * MIB, 2 * MIB] and digests[0] != digests[1]
        window = Window(None)
        streams.read(paths, digests, window)
        assert window.wall_s > 0 and window.daemon_s is None
        again = streams.write(paths, [3, 4], Window(None))
        assert again[0] != digests[0]  # stamped anew: new content for every write
        with open(paths[1], "r+b") as f:
            f.seek(MIB)
            byte = f.read(1)
            f.seek(MIB)
            f.write(bytes([byte[0] ^ 1]))
        with pytest.raises(RuntimeError, match=r"stream 1 read back 2097152 bytes of .*b\.bin with SHA-256"):
            streams.read(paths, again, Window(None))


def test_thread_table_per_name_and_busiest() -> None:
    runs = [dict(_run("write", 1, rep, "cowfs", 1.0, 2.0), daemon_threads={"main": 0.5 + rep, "cowfs-chunk": 1.0},
                 busiest_thread=("main", 0.4 + 0.5 * rep)) for rep in (0, 1)]
    runs.append(_run("write", 1, 0, "plain", 5.0))
    lines = thread_table(runs)
    assert lines[2] == "| part | S | main | cowfs-chunk | busiest |"
    assert lines[4] == "| write | 1 | 1.00 | 1.00 | main 0.90 |"
    assert thread_table([_run("write", 1, 0, "cowfs", 1.0, 2.0)]) == []


def test_thread_cpu_of_a_live_process_by_name() -> None:
    """This process's threads: the main thread by that name, a named thread's CPU under its name
    without its digits, and what a thread that ended in between used counted as "exited"."""
    import os
    import threading

    from cowfs import _native
    from tools.bench.mounting import cpu_seconds, thread_cpu_delta, thread_cpu_seconds

    tids: dict[str, int] = {}

    def spin(name: str, stop: threading.Event, spun: threading.Event) -> None:
        tids[name] = threading.get_native_id()
        _native.name_thread(name)
        t = time.thread_time()
        while time.thread_time() - t < 0.2:
            pass
        spun.set()
        stop.wait()

    pid = os.getpid()
    before, total0 = thread_cpu_seconds(pid), cpu_seconds(pid)
    assert before[pid][0] == "main"
    stop, live_spun, gone_spun = threading.Event(), threading.Event(), threading.Event()
    live = threading.Thread(target=spin, args=("bench-live7", stop, live_spun))
    gone_stop = threading.Event()
    gone = threading.Thread(target=spin, args=("bench-gone", gone_stop, gone_spun))
    live.start()
    gone.start()
    assert live_spun.wait(30) and gone_spun.wait(30)
    gone_stop.set()
    gone.join()
    deadline = time.monotonic() + 30
    while os.path.exists(f"/proc/{pid}/task/{tids['bench-gone']}"):  # the OS thread ends just after join
        assert time.monotonic() < deadline
        time.sleep(0.01)
    try:
        after = thread_cpu_seconds(pid)
        per = thread_cpu_delta(before, after, cpu_seconds(pid) - total0)
    finally:
        stop.set()
        live.join()
    assert per["bench-live"] >= 0.15  # the digits dropped from the name
    assert "bench-gone" not in per and per["exited"] >= 0.15
