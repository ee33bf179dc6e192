"""The write-time pieces benchmark (tools/bench/write_layout.py) on a small file: both arms
run, the baseline really cuts by content (many more extents, the shifted copy mostly new),
the stores are removed, for safetensors and torch.save files; bad arguments get one line."""
from __future__ import annotations

from pathlib import Path

import pytest

from tools.bench.write_layout import ARMS, FORMATS, main, markdown, run


@pytest.mark.parametrize("fmt", FORMATS)
def test_both_arms(tmp_path: Path, fmt: str) -> None:
    runs = run(0.02, 1, tmp_path, log=lambda _m: None, fmt=fmt)
    by_arm = {r["arm"]: r for r in runs}
    content, pieced = by_arm[ARMS[0]], by_arm[ARMS[1]]
    assert pieced["extents"] * 4 < content["extents"]
    assert pieced["shifted_added"] < min(64 << 10, content["shifted_added"])
    text = markdown(runs)
    assert "| pieced at write |" in text and "| content cut |" in text
    assert not list(tmp_path.iterdir())


def test_bad_arguments(tmp_path: Path, capsys) -> None:
    assert main(["--gib", "0", "--work", str(tmp_path)]) == 2
    assert main(["--work", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("write_layout: ") for line in err)
