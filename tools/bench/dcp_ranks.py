"""DCP saves and loads by R ranks of one node through one mount (issue 34's 16-core targets):
`make bench ARGS="--only dcp-ranks"`; the report and the targets are in tools/bench/dcpreport.py.

One store (`cowfs init --device file`, mounted with `--compact-idle off`) and a plain directory
in the same work directory (`--tmpfs`: a fresh tmpfs, as the issue's RAM-backed store). R rank
processes (a gloo group; `python -m tools.bench.dcp_ranks` with the rank's arguments) each
hold GIB/R of new random fp32 tensors, under keys of their own (so DCP writes every rank's
tensors, none deduplicated as replicated), new random bytes for every arm of every rep (so
that no cowfs arm finds its chunks stored by an arm before it). For each rep, the arms in an
order that turns:

* save: `dcp.save` with cowfs.dcp.Writer into the mount ("cowfs"), FileSystemWriter into the
  plain directory ("plain") and FileSystemWriter through the mount ("fuse"): the wall time
  from a barrier before the call to a barrier after it;
* async: `dcp.async_save` with cowfs.dcp.Writer and with FileSystemWriter into the plain
  directory: the stall (the longest any rank waited for the call to return, which is what a
  training loop waits) and the time until every rank's future is done;
* load (a second launch, after the page cache was dropped and the mount made again, so
  nothing is cached): `dcp.load` of each save arm's checkpoint with its reader, checked
  against the tensors saved.

Then the rep's files go (and `cowfs gc` gives their space back). Rank 0 prints one JSON line
per launch; everything it measured goes into results["dcp_ranks"].
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from .scaling import CowfsMount, mount_tmpfs, unmount_tmpfs

Log = Callable[[str], None]
REPO = Path(__file__).resolve().parents[2]
SAVE_ARMS = ("cowfs", "plain", "fuse")
ASYNC_ARMS = ("cowfs", "plain")
TENSOR_MIB = 64
ARM_SEEDS = {("save", "cowfs"): 1, ("save", "plain"): 2, ("save", "fuse"): 3, ("async", "cowfs"): 4, ("async", "plain"): 5}


# --- a rank: `python -m tools.bench.dcp_ranks --rank I ...`

def _state(rank: int, nbytes: int) -> dict[str, Any]:
    import torch

    per = TENSOR_MIB << 18  # fp32 elements per tensor
    count = max(1, nbytes // (per * 4))
    return {f"rank{rank}.layer{i}": torch.empty(per) for i in range(count)}


def _fill(state: dict[str, Any], rank: int, rep: int, kind: str, arm: str) -> None:
    """New random bytes for one arm's save (and its load's check): every arm of every rep
    saves bytes of its own, so no cowfs arm finds its chunks stored by an arm before it."""
    import torch

    g = torch.Generator().manual_seed((rep * 16 + ARM_SEEDS[kind, arm]) * 1000 + rank)
    for t in state.values():
        t.uniform_(generator=g)


def _writer(arm: str, root: Path, rep: int, kind: str) -> Any:
    import torch.distributed.checkpoint as dcp

    import cowfs.dcp

    where = root / ("plain" if arm == "plain" else "mnt/dcp") / f"{kind}-{arm}-{rep}"
    return cowfs.dcp.Writer(where) if arm == "cowfs" else dcp.FileSystemWriter(where)


def _reader(arm: str, root: Path, rep: int) -> Any:
    import torch.distributed.checkpoint as dcp

    import cowfs.dcp

    where = root / ("plain" if arm == "plain" else "mnt/dcp") / f"save-{arm}-{rep}"
    return cowfs.dcp.Reader(where) if arm == "cowfs" else dcp.FileSystemReader(where)


def rank_main(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=args.rank,
                            world_size=args.world)
    root, rep = Path(args.root), args.rep
    state = _state(args.rank, args.bytes_per_rank)
    out: dict[str, float] = {}

    def slowest(seconds: float) -> float:
        t = torch.tensor([seconds], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    if args.op == "save":
        for arm in args.arms.split(","):
            _fill(state, args.rank, rep, "save", arm)
            dist.barrier()
            t0 = time.perf_counter()
            dcp.save(state, storage_writer=_writer(arm, root, rep, "save"))
            dist.barrier()
            out[f"save_{arm}_s"] = time.perf_counter() - t0
        for arm in args.async_arms.split(",") if args.async_arms else []:
            _fill(state, args.rank, rep, "async", arm)
            dist.barrier()
            t0 = time.perf_counter()
            future = dcp.async_save(state, storage_writer=_writer(arm, root, rep, "async"))
            stall = time.perf_counter() - t0
            future.result()
            dist.barrier()
            out[f"async_{arm}_done_s"] = time.perf_counter() - t0
            out[f"async_{arm}_stall_s"] = slowest(stall)
    else:
        for arm in args.arms.split(","):
            _fill(state, args.rank, rep, "save", arm)
            target = {k: torch.empty_like(v) for k, v in state.items()}
            dist.barrier()
            t0 = time.perf_counter()
            dcp.load(target, storage_reader=_reader(arm, root, rep))
            dist.barrier()
            out[f"load_{arm}_s"] = time.perf_counter() - t0
            if not all(torch.equal(target[k], state[k]) for k in state):
                raise RuntimeError(f"rank {args.rank}: dcp.load ({arm}) did not give back what was saved")
            del target
    if args.rank == 0:
        print(json.dumps(out), flush=True)
    dist.destroy_process_group()
    return 0


# --- the part

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _launch(root: Path, ranks: int, bytes_per_rank: int, rep: int, op: str, arms: list[str],
            async_arms: list[str], limit_s: float = 1800) -> dict[str, float]:
    """Run the ranks of one launch to the end; rank 0's figures. Raises with a failed rank's
    stderr; once one rank fails (or `limit_s` passes) the others, which would wait for it at
    a barrier, are killed."""
    port = _free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    outs = [tempfile.TemporaryFile() for _ in range(ranks)]
    errs = [tempfile.TemporaryFile() for _ in range(ranks)]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for r in range(ranks):
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "tools.bench.dcp_ranks", "--rank", str(r), "--world", str(ranks),
                 "--port", str(port), "--root", str(root), "--rep", str(rep), "--bytes-per-rank", str(bytes_per_rank),
                 "--op", op, "--arms", ",".join(arms), "--async-arms", ",".join(async_arms)],
                env=env, cwd=REPO, stdin=subprocess.DEVNULL, stdout=outs[r], stderr=errs[r]))
        deadline = time.monotonic() + limit_s
        while any(p.poll() is None for p in procs):
            if any(p.returncode for p in procs) or time.monotonic() > deadline:
                break
            try:
                next(p for p in procs if p.returncode is None).wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                pass
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    try:
        failed = [(r, p.returncode) for r, p in enumerate(procs) if p.returncode != 0]
        if failed:
            r, code = next(((r, c) for r, c in failed if c != -9), failed[0])  # the first that failed by itself
            errs[r].seek(0)
            err = errs[r].read().decode(errors="replace").strip()[-2000:]
            raise RuntimeError(f"dcp-ranks: rank {r} of {ranks} exited {code} ({op}): {err}")
        outs[0].seek(0)
        return json.loads(outs[0].read().decode().strip().splitlines()[-1])
    finally:
        for f in (*outs, *errs):
            f.close()


def _turn(arms: tuple[str, ...], k: int) -> list[str]:
    return list(arms[k % len(arms):] + arms[:k % len(arms)])


def run_dcp_ranks(work: Path, ranks: int, gib: float, reps: int, tmpfs: bool, workers: int | None,
                  log: Log) -> dict[str, Any]:
    """The part in `work` (created here; on a fresh tmpfs with `tmpfs`); everything it made is
    unmounted and removed however it ends."""
    from .mounting import init_store
    from .scaling import filesystem

    if ranks < 1 or gib <= 0 or reps < 1:
        raise ValueError("dcp-ranks: --dcp-ranks, --dcp-gib and --dcp-reps must be positive")
    bytes_per_rank = int(gib * (1 << 30)) // ranks
    work.mkdir(parents=True)
    on_tmpfs = False
    try:
        if tmpfs:
            # the save arms and the async arms of one rep at once, and room for the store's segments
            mount_tmpfs(work, int(gib * (1 << 30) * (len(SAVE_ARMS) + len(ASYNC_ARMS)) * 1.3) + (2 << 30))
            on_tmpfs = True
        fs_type, fs = filesystem(work)
        (work / "plain").mkdir()
        mount = CowfsMount(init_store(work / "store", device="file"), work / "mnt", workers)
        mount.mount()
        rows: list[dict[str, float]] = []
        try:
            (work / "mnt" / "dcp").mkdir()
            for k in range(reps):
                row = _launch(work, ranks, bytes_per_rank, k, "save", _turn(SAVE_ARMS, k), _turn(ASYNC_ARMS, k))
                cold = mount.cold()
                row.update(_launch(work, ranks, bytes_per_rank, k, "load", _turn(SAVE_ARMS, k), []))
                row["cold"] = float(cold)
                rows.append(row)
                log(f"  dcp-ranks rep {k + 1}/{reps}: " + ", ".join(f"{n} {v:.2f}" for n, v in row.items()))
                for d in (work / "plain").iterdir():
                    shutil.rmtree(d)
                for d in (work / "mnt" / "dcp").iterdir():
                    shutil.rmtree(d)
                mount.gc()
        finally:
            mount.unmount()
        return {"fs": fs, "fs_type": fs_type, "cpus": os.cpu_count() or 1, "ranks": ranks,
                "bytes": bytes_per_rank * ranks, "workers": workers, "reps": rows}
    finally:
        if on_tmpfs:
            unmount_tmpfs(work)
        shutil.rmtree(work, ignore_errors=True)


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tools.bench.dcp_ranks",
                                description="one rank of the dcp-ranks part (run `python -m tools.bench --only dcp-ranks`)")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--root", required=True)
    p.add_argument("--rep", type=int, required=True)
    p.add_argument("--bytes-per-rank", type=int, required=True)
    p.add_argument("--op", choices=("save", "load"), required=True)
    p.add_argument("--arms", required=True)
    p.add_argument("--async-arms", default="")
    return p.parse_args(argv)


if __name__ == "__main__":
    sys.exit(rank_main(_parse(sys.argv[1:])))
