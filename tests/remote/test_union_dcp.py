"""A real multi-process DCP save across two "nodes" (two stores with their own mounts and
daemons on this machine, uploading into one prefix): gloo, world size 4, ranks 0 and 2 on
one node and 1 and 3 on the other. A consumer of every store (`--all-stores`) lists the
checkpoint as complete only once `.metadata` and every file it names are there, and loads
it bitwise, and so does the other node's own mount of the namespace (`--all-stores`); a save (world size 2, one rank per node) in which a rank is killed never shows
as complete, and the one before still loads (docs/design.md section 17, "One namespace for a job")."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.support.checkpointutil import dcp_metadata
from tests.support.consumerutil import Consumer, wait_for
from tests.support import ranks
from tests.support.mountutil import cowfs, mounted
from tests.support.storeutil import assert_clean, data, new_store

torch = pytest.importorskip("torch")
import torch.distributed.checkpoint as dcp  # noqa: E402

from tests.support.dcp_ranks import same, state_for, zeros_like  # noqa: E402

WORLD = 4


pytestmark = pytest.mark.usefixtures("aws_env")  # the engine's keys in AWS_* (conftest.py)


def run_ranks(tmp_path: Path, nodes: list[Path], step: int, mode: str, world: int = WORLD) -> list[int]:
    rendezvous = tmp_path / f"rendezvous-{step}-{mode}"
    return ranks.run_ranks("tests.support.dcp_nodes", [
        [str(r), str(world), str(rendezvous), str(nodes[r % len(nodes)] / "job" / f"step-{step}"), mode]
        for r in range(world)], quiet=mode == "die")


def complete(cons: Path) -> set[str]:
    return {c["path"] for c in json.loads(cowfs("checkpoints", str(cons), "--json").stdout) if c["kind"] == "dcp"}


def own_files(node: Path, path: str) -> list[str]:
    """The names the node's store itself holds in `path` (not the other nodes')."""
    return sorted(line.split()[-1] for line in cowfs("ls", str(node), path).stdout.decode().splitlines())


def whole_state(step: int) -> dict[str, "torch.Tensor"]:
    out: dict[str, torch.Tensor] = {}
    for r in range(WORLD):
        out.update(state_for(r, step))
    return out


@pytest.mark.long
def test_a_dcp_save_across_two_nodes_shows_whole_on_a_consumer(tmp_path, rgw, s3_bucket):
    url = f"s3://{s3_bucket.name}/job"
    endpoint = rgw.credentials.endpoint
    stores = [new_store(tmp_path / f"node{i}", segment_size=16 << 20) for i in range(2)]
    for p in stores:
        cowfs("remote", "set", str(p), url, "--endpoint", endpoint, "--notify", "127.0.0.1:0")
    for p in stores:
        cowfs("remote", "push", str(p))  # both stores in the bucket before the nodes mount the namespace
    with mounted(stores[0], tmp_path / "n0", "--all-stores") as n0, \
            mounted(stores[1], tmp_path / "n1", "--all-stores") as n1, \
            Consumer(url, endpoint, tmp_path / "cons", tmp_path / "cache", "--all-stores") as cons:
        # the coordinator's .metadata before another node's file: not complete until it arrives
        for node in (n0, n1):
            (node / "job" / "step-0").mkdir(parents=True)
        (n0 / "job" / "step-0" / "__0_0.distcp").write_bytes(data(20_000, 0))
        (n0 / "job" / "step-0" / ".metadata").write_bytes(dcp_metadata(2))
        wait_for("the metadata on the consumer", lambda: (cons / "job" / "step-0" / ".metadata").exists())
        assert "/job/step-0" not in complete(cons)
        (n1 / "job" / "step-0" / "__1_0.distcp").write_bytes(data(20_000, 1))
        wait_for("step-0 complete", lambda: "/job/step-0" in complete(cons))

        assert run_ranks(tmp_path, [n0, n1], 1, "save") == [0] * WORLD
        assert own_files(n0, "/job/step-1") == [".metadata", "__0_0.distcp", "__2_0.distcp"]
        assert own_files(n1, "/job/step-1") == ["__1_0.distcp", "__3_0.distcp"]
        wait_for("step-1 complete on the consumer", lambda: "/job/step-1" in complete(cons))
        got = zeros_like(whole_state(1))
        dcp.load(got, storage_reader=dcp.FileSystemReader(cons / "job" / "step-1"))
        assert same(got, whole_state(1))
        # a restart on the other node: its own mount shows the whole checkpoint, and loads it
        every = [".metadata"] + [f"__{r}_0.distcp" for r in range(WORLD)]
        wait_for("step-1 whole on n1's own mount", lambda: sorted(os.listdir(n1 / "job" / "step-1")) == every)
        got = zeros_like(whole_state(1))
        dcp.load(got, storage_reader=dcp.FileSystemReader(n1 / "job" / "step-1"))
        assert same(got, whole_state(1))

        codes = run_ranks(tmp_path, [n0, n1], 2, "die", world=2)  # rank 1, on the other node, dies
        assert codes[1] == -9 and 0 not in codes, codes  # no rank finished the save
        for node in (n0, n1):  # what the live ranks wrote reached the bucket, and so the consumer
            gen = int(json.loads(cowfs("stats", str(node), "--json").stdout)["generations"])
            wait_for("the upload", lambda node=node, gen=gen: int(json.loads(cowfs(
                "remote", "status", str(node), "--json").stdout)["catalog_generation"]) >= gen)
        wait_for("rank 0's file on the consumer", lambda: (cons / "job" / "step-2" / "__0_0.distcp").exists())
        assert not (cons / "job" / "step-2" / ".metadata").exists()
        assert complete(cons) == {"/job/step-0", "/job/step-1"}
        got = zeros_like(whole_state(1))
        dcp.load(got, storage_reader=dcp.FileSystemReader(cons / "job" / "step-1"))
        assert same(got, whole_state(1))
    for p in stores:
        assert_clean(p)
