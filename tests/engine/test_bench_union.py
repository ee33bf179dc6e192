"""The report of the namespace benchmark (tools/bench/union.py): every rep shown, the
target met only when the worst rep is within 1 s, and the metadata it writes names every
rank's file as DCP's does (what cowfs reads of it)."""
from __future__ import annotations

from cowfs.store.checkpoints.dcp_files import named_files
from tools.bench.union import metadata, table


def test_the_table_gives_every_rep_and_judges_by_the_worst():
    rows = table([{"producers": 2, "filler_files": 0, "latency_s": [0.5, 0.61, 0.7]},
                  {"producers": 8, "filler_files": 0, "latency_s": [0.9, 1.2, 0.8]}])
    assert rows[2] == "| 2 | 0 | 0.50 / 0.61 / 0.70 | 0.61 | 0.70 | met |"
    assert rows[3] == "| 8 | 0 | 0.90 / 1.20 / 0.80 | 0.90 | 1.20 | not met |"


def test_the_metadata_names_every_rank():
    assert named_files(metadata(8)) == {f"__{r}_0.distcp" for r in range(8)}
