"""The issue-36 benchmark (tools/bench/fdelta.py) on a made-up series of three bf16
checkpoints: both arms store and read it back, the baseline arm really runs without the
float delta (and gives the codec back afterwards), and the per-codec table shows the
float delta ahead on weights."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from cowfs.store.log import codecs
from tools.bench.fdelta import codec_speeds, markdown, run_arm
from tools.bench.pieces import load_series

pytestmark = pytest.mark.mount


def series(root: Path) -> Path:
    g = torch.Generator().manual_seed(3)
    w = torch.randn(256, 1024, generator=g) * 0.02
    for step in (20, 40, 60):
        w = w - 1e-3 * torch.randn(w.shape, generator=g)
        ck = root / f"checkpoint-{step}"
        ck.mkdir(parents=True)
        save_file({"layer.weight": w.to(torch.bfloat16)}, ck / "model.safetensors")
        (ck / "trainer_state.json").write_text(f'{{"global_step": {step}}}')
    return root


def test_both_arms_and_the_codec_table(tmp_path: Path) -> None:
    d = series(tmp_path / "series")
    before = run_arm("before", d, tmp_path, 1)
    assert codecs.FLOAT_FORMATS["BF16"] == (2, 7, 8)  # the arm put the codec back
    after = run_arm("fdelta", d, tmp_path, 1)
    assert "fdelta" not in before["codecs"] and after["codecs"].get("fdelta", 0) > 0
    assert after["stored"] < before["stored"] and before["logical"] == after["logical"]
    assert set(after["read_MBps"]) == {"checkpoint-20", "checkpoint-40", "checkpoint-60"}
    speeds = codec_speeds(load_series(d, 1 << 20), 1)
    weights = speeds["model.safetensors:param"]
    assert weights["fdelta ratio"] < weights["sub ratio"] < 1
    text = markdown("made-up", [before, after], speeds)
    assert "| fdelta |" in text and "model.safetensors:param" in text
    assert not list(tmp_path.glob("store-*"))  # the stores are removed
