"""`python -m tools.bench [--full] [--only PARTS]`: the issue-6 and issue-14 benchmark. See
docs/benchmarks.md.

Quick mode (default): a ~17M-parameter GPT-2-shaped model, 10 checkpoints per workload.
--full: the GPT-2 small shape (~124M parameters), 10 checkpoints per workload.
Parts (--only, comma-separated; default all): series (the workloads, each ending with
`cowfs compact` + `cowfs gc`), snapshot (10,000 files), writeback (cache on vs off),
compaction (issue 14: HF Trainer series written into the mount, compaction off vs idle,
torch.save rewriting one path, restic and borg; tools/bench/compaction.py), datapath
(issue 15: saves, raw writes, cold reads and small files against the plain disk, with the
daemon's CPU per thread; tools/bench/datapath.py), remote (issue 17: the remote tier against
a Ceph RGW started on 127.0.0.1; tools/bench/remote.py, also `make bench-remote`), scaling
(issue 33: 1 to 16 streams of writes and cold reads, torch.save and torch.load, through one mount
against a plain directory, with the daemon's CPU per GiB; --tmpfs for RAM-backed figures;
tools/bench/scaling.py), plugins (issue 34: background cowfs.save, cowfs.load, cowfs.dcp against
torch.save, torch.load and DCP's FileSystemWriter/Reader on the disk; tools/bench/plugins.py), dcp-ranks
(issue 34: dcp.save, async_save and dcp.load by R gloo ranks through cowfs.dcp, FileSystemWriter through the
mount and into a plain directory; tools/bench/dcp_ranks.py; --tmpfs as for scaling). `--only
compaction` also runs the series frozen-backbone and sparse-embedding, which the issue-14
targets name, unless --workloads says otherwise.
Everything (stores, mounts, baseline directories) lives in one temporary directory
under --dir, so cowfs and the baselines share a filesystem; it is removed at the end,
and every mount is unmounted, also on Ctrl-C or an error.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from . import compactreport, datapathreport, dcpreport, extras, report, scalingreport
from .compaction import run_compaction
from .datapath import run_datapath
from .dcp_ranks import run_dcp_ranks
from .plugins import report as plugins_report
from .plugins import run_plugins
from .docs import COMPACTION, DATAPATH, DOCS, REPO, update_docs
from .models import GPT2_SMALL, QUICK, GPT, param_count
from .scaling import run_scaling
from .series import run_series
from .workloads import WORKLOADS, Scale


PARTS = ("series", "snapshot", "writeback", "compaction", "datapath", "remote", "scaling", "plugins", "dcp-ranks")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tools.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--full", action="store_true", help="GPT-2 small (~124M parameters) instead of the quick model")
    p.add_argument("--dir", default="/var/tmp", help="parent of the temporary work directory (stores and baselines; default /var/tmp)")
    p.add_argument("--out", default=str(REPO / "bench-results"), help="where the JSON, Markdown and PNG go")
    p.add_argument("--plugins-mib", type=int, default=256, help="MiB per save in the plugins part (default 256)")
    p.add_argument("--plugins-reps", type=int, default=3, help="reps of the plugins part (default 3)")
    p.add_argument("--only", default=",".join(PARTS), help=f"comma-separated parts to run, of: {', '.join(PARTS)} (default all)")
    p.add_argument("--workloads", default=None, help=f"comma-separated subset of: {', '.join(WORKLOADS)} "
                   f"(default all; with --only compaction alone: {', '.join(compactreport.T4_WORKLOADS)})")
    p.add_argument("--checkpoints", type=int, default=10, help="checkpoints per workload (default 10)")
    p.add_argument("--steps", type=int, default=1, help="optimizer steps between checkpoints (default 1)")
    p.add_argument("--snapshot-files", type=int, default=10000, help="files in the snapshot test (0: skip it)")
    p.add_argument("--writeback-mib", type=int, default=None, help="MiB for the writeback on/off test (0: skip; default 256 quick, 1024 full)")
    p.add_argument("--compaction-reps", type=int, default=2, help="Trainer runs per dtype and arm in the compaction part (default 2)")
    p.add_argument("--read-reps", type=int, default=5, help="cold reads per run in the compaction part (default 5)")
    p.add_argument("--datapath-mib", type=int, default=None, help="MiB per save, write and read in the datapath part "
                   "(default 256 quick, 1024 full)")
    p.add_argument("--datapath-reps", type=int, default=5, help="interleaved pairs per workload in the datapath part (default 5)")
    p.add_argument("--small-files", type=int, default=2000, help="small files per run in the datapath part (default 2000)")
    p.add_argument("--datapath-writeback", choices=("default", "on", "off"), default="default",
                   help="the datapath part's mount: the kernel's writeback cache as cowfs mount sets it, on or off")
    sc = p.add_argument_group("the scaling part (issue 33)")
    sc.add_argument("--streams", default="1,4,8,16", help="stream counts, comma-separated (default 1,4,8,16)")
    sc.add_argument("--mib-per-stream", type=int, default=None, help="MiB each stream writes and reads "
                    "(default 256 quick, 1024 full)")
    sc.add_argument("--reps", type=int, default=2, help="reps per stream count and of torch, each cowfs and plain "
                    "(default 2)")
    sc.add_argument("--torch-gib", type=float, default=None, help="GiB of the torch.save / torch.load state dict "
                    "(default 0.25 quick, 4 full; 0 skips torch)")
    sc.add_argument("--workers", type=int, default=None, help="cowfs mount --workers N (default: cowfs mount's)")
    sc.add_argument("--scaling-writeback", choices=("default", "on", "off"), default="default",
                    help="the scaling part's mount: the kernel's writeback cache as cowfs mount sets it, on or off")
    sc.add_argument("--tmpfs", action="store_true", help="run the part on a fresh tmpfs mounted under the work "
                    "directory (RAM-backed figures; unmounted at the end)")
    sc.add_argument("--tmpfs-size", default=None, help="size of that tmpfs, e.g. 32G (default: what the largest "
                    "stream count and the torch file need, with room)")
    sc.add_argument("--budget-s", type=float, default=None, help="start no new rep or stream count once the part "
                    "has run this many seconds (default: no limit); the report says what was skipped")
    dr = p.add_argument_group("the dcp-ranks part (issue 34; --tmpfs and --workers as for scaling)")
    dr.add_argument("--dcp-ranks", type=int, default=8, help="ranks (processes of one gloo group; default 8)")
    dr.add_argument("--dcp-gib", type=float, default=None, help="GiB of the whole state dict (default 1, 8 with --full)")
    dr.add_argument("--dcp-reps", type=int, default=2, help="reps (default 2)")
    p.add_argument("--update-docs", action="store_true",
                   help="put the tables into docs/benchmarks.md (the issue-6 section and docs/bench.png only after a run of "
                   "every part and workload; the compaction section after a run with the compaction part)")
    return p.parse_args(argv)


def filesystem_of(path: Path) -> str:
    best = ("?", "?", "")
    with open("/proc/self/mounts") as f:
        for line in f:
            dev, mnt, fstype = line.split()[:3]
            if str(path).startswith(mnt.rstrip("/") + "/") or str(path) == mnt:
                if len(mnt) >= len(best[2]):
                    best = (dev, fstype, mnt)
    return f"{best[1]} on {best[0]} ({path})"


def git_commit() -> str:
    r = subprocess.run(["git", "-C", str(REPO), "describe", "--always", "--dirty"], capture_output=True, text=True)
    return r.stdout.strip() or "?"


_signalled = False


def _interrupt(signum: int, frame: object) -> None:
    global _signalled
    _signalled = True
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    parts = [n.strip() for n in args.only.split(",") if n.strip()]
    if [n for n in parts if n not in PARTS]:
        print(f"bench: unknown part(s): {', '.join(n for n in parts if n not in PARTS)}; parts: {', '.join(PARTS)}", file=sys.stderr)
        return 2
    if args.workloads is not None:
        names = [n.strip() for n in args.workloads.split(",") if n.strip()]
    elif "series" in parts:
        names = list(WORKLOADS)
    else:
        names = list(compactreport.T4_WORKLOADS) if "compaction" in parts else []
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        print(f"bench: unknown workload(s): {', '.join(unknown)}", file=sys.stderr)
        return 2
    cfg = GPT2_SMALL if args.full else QUICK
    scale = Scale(steps=args.steps, batch=4, seq=64, frozen_trained_layers=2 if args.full else 1,
                  lora_layers=4 if args.full else 2, sparse_rows_fraction=0.01)
    try:
        scaling_opts = scalingreport.options_from_args(args) if "scaling" in parts else None
    except ValueError as e:
        print(f"bench: {e}", file=sys.stderr)
        return 2
    wb_mib = args.writeback_mib if args.writeback_mib is not None else (1024 if args.full else 256)
    out_dir = Path(args.out).absolute()
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(os.cpu_count() or 1)

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)

    # SIGTERM unwinds like Ctrl-C, so every `finally` (unmount, cleanup) runs
    signal.signal(signal.SIGTERM, _interrupt)
    command = os.environ.get("COWFS_BENCH_COMMAND") or " ".join(
        [".venv/bin/python -m tools.bench", *(sys.argv[1:] if argv is None else argv)])
    results: dict[str, Any] = {
        "mode": "full" if args.full else "quick", "model": cfg.name, "params": param_count(GPT(cfg)),
        "checkpoints": args.checkpoints, "steps": args.steps, "scale": vars(scale), "fs": "", "parts": parts,
        "command": command, "git": git_commit(), "torch": torch.__version__, "python": platform.python_version(),
        "cpus": os.cpu_count(), "loadavg_start": os.getloadavg(), "started": time.time(), "series": [],
    }
    work = Path(tempfile.mkdtemp(prefix="bench-", dir=args.dir))
    results["fs"] = filesystem_of(work)
    log(f"bench ({results['mode']}): {cfg.name}, {results['params'] / 1e6:.1f}M parameters; work dir {work}")
    try:
        for i, name in enumerate(names):
            log(f"workload {name}")
            wl = WORKLOADS[name](cfg, scale, 1000 + i)
            d = work / name
            try:
                results["series"].append(run_series(wl, args.checkpoints, d, log))
            finally:
                shutil.rmtree(d, ignore_errors=True)
        if "compaction" in parts:
            log(f"compaction (issue 14): Trainer series, {args.compaction_reps} runs per dtype and arm")
            try:
                results["compaction"] = run_compaction(work / "compaction", args.compaction_reps, args.read_reps, log,
                                                       checkpoints=args.checkpoints)
            finally:
                shutil.rmtree(work / "compaction", ignore_errors=True)
        if "datapath" in parts:
            mib = args.datapath_mib if args.datapath_mib is not None else (1024 if args.full else 256)
            log(f"data path (issue 15): {mib} MiB, {args.datapath_reps} pairs per workload")
            try:
                results["datapath"] = run_datapath(work / "datapath", mib << 20, args.small_files, args.datapath_reps, log,
                                                   writeback=args.datapath_writeback)
            finally:
                shutil.rmtree(work / "datapath", ignore_errors=True)
        if "remote" in parts:
            log("remote tier (issue 17): a Ceph RGW on 127.0.0.1; saves, notices, consumer reads, shared prefix")
            from .remote import main as remote_main  # boto3 and the cluster: only for this part

            remote_main(["--dir", str(work), "--reps", "5", "--out", str(work / "remote.json")])
            results["remote"] = json.loads((work / "remote.json").read_text())
        if scaling_opts is not None:
            log(f"scaling (issue 33): {scaling_opts.streams} streams of {scaling_opts.mib_per_stream} MiB, torch "
                f"{scaling_opts.torch_gib:g} GiB, {scaling_opts.reps} rep(s)" + (" on a tmpfs" if scaling_opts.tmpfs else ""))
            results["scaling"] = run_scaling(work / "scaling", scaling_opts, log)
        if "plugins" in parts:
            log(f"plug-ins (issue 34): {args.plugins_mib} MiB, {args.plugins_reps} reps")
            try:
                results["plugins"] = run_plugins(work / "plugins", args.plugins_mib, args.plugins_reps, log)
            finally:
                shutil.rmtree(work / "plugins", ignore_errors=True)
            print(plugins_report(results["plugins"]), flush=True)
        if "dcp-ranks" in parts:
            gib = args.dcp_gib or (8.0 if args.full else 1.0)
            log(f"dcp-ranks (issue 34): {args.dcp_ranks} ranks, {gib:g} GiB, {args.dcp_reps} reps"
                + (" on a tmpfs" if args.tmpfs else ""))
            results["dcp_ranks"] = run_dcp_ranks(work / "dcp-ranks", args.dcp_ranks, gib, args.dcp_reps, args.tmpfs,
                                                 args.workers, log)
            print(dcpreport.report(results["dcp_ranks"]), flush=True)
        if args.snapshot_files and "snapshot" in parts:
            log(f"snapshot creation with {args.snapshot_files} files")
            try:
                results["snapshot_10k"] = extras.snapshot_many_files(work / "snap", args.snapshot_files, 5, log)
            finally:
                shutil.rmtree(work / "snap", ignore_errors=True)
        if wb_mib and "writeback" in parts:
            log(f"writeback cache on vs off, {wb_mib} MiB")
            try:
                results["writeback"] = extras.writeback_compare(work / "wb", wb_mib << 20, 2, log)
            finally:
                shutil.rmtree(work / "wb", ignore_errors=True)
    except BaseException as e:
        if not (_signalled or isinstance(e, KeyboardInterrupt)):
            raise
        # (a library may turn the KeyboardInterrupt into its own error on the way out)
        log("interrupted: mounts were unmounted, removing the work directory")
        return 130
    finally:
        shutil.rmtree(work, ignore_errors=True)
    results["loadavg_end"] = os.getloadavg()
    results["seconds"] = time.time() - results["started"]
    summaries = [report.summarize_series(s) for s in results["series"]]
    tgts = report.targets(summaries, results.get("snapshot_10k"))
    results["summary"], results["targets"] = summaries, tgts
    md = report.markdown(results, summaries, tgts)
    c_md = compactreport.section(results)
    d_md = datapathreport.section(results)
    s_md = scalingreport.section(results)
    r_md = dcpreport.report(results["dcp_ranks"]) if results.get("dcp_ranks") else "(the dcp-ranks part did not run)\n"
    stem = f"bench-{results['mode']}-{time.strftime('%Y%m%d-%H%M%S')}"
    (out_dir / f"{stem}.json").write_text(json.dumps(results, indent=1, default=str))
    (out_dir / f"{stem}.md").write_text(f"Command: `{command}`\n\n{md}\n### Compaction (issue 14)\n\n{c_md}"
                                        f"\n### Data path (issue 15)\n\n{d_md}\n### Scaling (issue 33)\n\n{s_md}"
                                        f"\n### DCP by ranks (issue 34)\n\n{r_md}")
    png: Path | None = out_dir / f"{stem}.png"
    if not results["series"] or not report.plot(results, png):  # type: ignore[arg-type]
        if results["series"]:
            log("matplotlib is not installed (pip install '.[bench]'): no PNG")
        png = None
    print()
    print(md)
    print("### Compaction (issue 14)\n")
    print(c_md)
    print("### Data path (issue 15)\n")
    print(d_md)
    print("### Scaling (issue 33)\n")
    print(s_md)
    log(f"took {results['seconds'] / 60:.1f} min; wrote {out_dir}/{stem}.json, .md" + (", .png" if png else ""))
    if args.update_docs:
        if set(parts) == set(PARTS) and names == list(WORKLOADS):
            update_docs(md, png, command, results["started"])
        if "compaction" in parts:
            update_docs(c_md, None, command, results["started"], section=COMPACTION)
        if "datapath" in parts:
            update_docs(d_md, None, command, results["started"], section=DATAPATH)
        log(f"updated {DOCS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
