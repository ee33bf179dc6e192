"""A rank of the multi-node DCP tests (tests/remote/test_union_dcp.py), run by
`python -m tests.support.dcp_nodes RANK WORLD RENDEZVOUS CKPT MODE`: a gloo group on
loopback saving dcp_ranks' state dict for this rank with cowfs.dcp's Writer into CKPT, a
directory in this rank's node's mount (each "node" is a store and a mount of its own).
MODE "save" saves; "die" saves with rank WORLD - 1 killing itself midway through its file."""
from __future__ import annotations

import datetime
import sys
from pathlib import Path

import torch.distributed as dist
import torch.distributed.checkpoint as dcp

import cowfs.dcp
from tests.support.dcp_ranks import _DyingFileSystem, state_for


def main() -> int:
    rank, world, rendezvous, ckpt, mode = (int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], Path(sys.argv[4]),
                                           sys.argv[5])
    step = int(ckpt.name.rsplit("-", 1)[-1])
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=10 if mode == "die" else 300))
    try:
        writer = cowfs.dcp.Writer(ckpt)
        if mode == "die" and rank == world - 1:
            writer.fs = _DyingFileSystem()
        dcp.save(state_for(rank, step), storage_writer=writer)
        return 0 if mode == "save" else 3
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
