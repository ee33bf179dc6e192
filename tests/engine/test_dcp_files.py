"""A DCP checkpoint is whole only when every data file its `.metadata` names is there
(cowfs/store/checkpoints/dcp_files.py): the names read from torch's own pickled Metadata
without unpickling it, bad inputs, and the checkpoint index and the snapshot plan on a
store whose coordinator's `.metadata` came before another rank's file."""
from __future__ import annotations

import io
import pickle
import random

import pytest

from cowfs.store.checkpoints import dcp_files
from cowfs.store.checkpoints import index as checkpoint_index
from cowfs.store.checkpoints import snapshot as ckpt
from cowfs.store.checkpoints.rules import DCP, Trigger
from tests.support.checkpointutil import dcp_metadata, mkdirs
from tests.support.storeutil import data


def test_the_names_come_from_torchs_metadata_without_unpickling_it():
    torch = pytest.importorskip("torch")
    from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, TensorStorageMetadata
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    storage = {MetadataIndex(f"w{i}", torch.Size([0])): _StorageInfo(f"__{i % 3}_0.distcp", 100 * i, 100)
               for i in range(9)}
    meta = Metadata(state_dict_metadata={"w0": TensorStorageMetadata.__new__(TensorStorageMetadata)},
                    storage_data=storage)
    buf = io.BytesIO()
    pickle.dump(meta, buf)
    assert dcp_files.named_files(buf.getvalue()) == {"__0_0.distcp", "__1_0.distcp", "__2_0.distcp"}


@pytest.mark.parametrize("blob", [b"", b"not a pickle", data(4096, 7), pickle.dumps({"x": 1})[:-3]])
def test_bad_metadata_names_nothing_and_raises_nothing(blob):
    assert not dcp_files.named_files(blob)


def test_random_pickles_give_exactly_their_distcp_strings():
    rng = random.Random(5)
    for _ in range(50):
        names = {f"__{rng.randrange(64)}_{rng.randrange(4)}.distcp" for _ in range(rng.randrange(1, 20))}
        other = [f"w{rng.randrange(1000)}" for _ in range(10)]
        obj = {"names": [n for n in names for _ in range(2)], "other": other, "n": rng.random()}
        for proto in (0, 2, 4, 5):
            assert dcp_files.named_files(pickle.dumps(obj, protocol=proto)) == names


def test_a_checkpoint_missing_a_named_file_is_not_complete_until_it_arrives(store):
    mkdirs(store, "/dcp/step-3")
    store.write_file("/dcp/step-3/__0_0.distcp", data(20_000, 1))
    gen = store.write_file("/dcp/step-3/.metadata", dcp_metadata(2)).birth_gen  # rank 1's file not there yet
    assert [c.live.path for c in checkpoint_index.build(store).checkpoints if c.live] == []
    with pytest.raises(ckpt.NotComplete, match="__1_0.distcp"):
        ckpt.plan(store, Trigger(DCP, "/dcp/step-3/.metadata", gen))
    store.write_file("/dcp/step-3/__1_0.distcp", data(20_000, 2))
    assert [c.live.path for c in checkpoint_index.build(store).checkpoints] == ["/dcp/step-3"]
    assert ckpt.plan(store, Trigger(DCP, "/dcp/step-3/.metadata", store.generation)).name == "dcp@step-3"
    store.write_file("/dcp/step-3/__1_0.distcp", b"")  # an empty file is not a rank's data
    assert checkpoint_index.build(store).checkpoints == []
