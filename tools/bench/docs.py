"""Where the benchmark's results go in the repository: the results section of
docs/benchmarks.md (between the markers) and docs/bench.png. Used by run.py at the end of
a run and by report.py when it redraws a finished run."""
from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs" / "benchmarks.md"
BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"


def update_docs(md: str, png: Path | None, command: str, when: float) -> None:
    """Replace the results section of docs/benchmarks.md (between the markers); copy the plot."""
    text = DOCS.read_text()
    body = f"{BEGIN}\nCommand: `{command}` (run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(when))}).\n\n{md}"
    if png is not None:
        shutil.copyfile(png, DOCS.parent / "bench.png")
        body += "\n![stored bytes and save time per checkpoint](bench.png)\n"
    body += f"{END}"
    text = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _m: body, text, flags=re.S)
    DOCS.write_text(text)
