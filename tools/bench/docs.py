"""Where the benchmark's results go in the repository: the results sections of
docs/benchmarks.md (between markers: the issue-6 section and the compaction section) and
docs/bench.png. Used by run.py at the end of a run and by report.py when it redraws a
finished run."""
from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs" / "benchmarks.md"
BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"
COMPACTION = "compaction"  # the section name of <!-- compaction:begin --> ... <!-- compaction:end -->
DATAPATH = "datapath"  # <!-- datapath:begin --> ... <!-- datapath:end --> (issue 15)


def update_docs(md: str, png: Path | None, command: str, when: float, section: str = "bench") -> None:
    """Replace a results section of docs/benchmarks.md (between its markers); copy the plot."""
    begin, end = f"<!-- {section}:begin -->", f"<!-- {section}:end -->"
    text = DOCS.read_text()
    if begin not in text:
        raise RuntimeError(f"{DOCS} has no {begin} marker")
    body = f"{begin}\nCommand: `{command}` (run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(when))}).\n\n{md}"
    if png is not None:
        shutil.copyfile(png, DOCS.parent / "bench.png")
        body += "\n![stored bytes and save time per checkpoint](bench.png)\n"
    body += f"{end}"
    text = re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda _m: body, text, flags=re.S)
    DOCS.write_text(text)
