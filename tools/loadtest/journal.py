"""The journals: what each writer did, and which snapshots the controller recorded.

JSON lines in WORKDIR (not on the mount). A writer appends to journal-wN.jsonl, the
controller to snapshots.jsonl; the other processes read them as they grow through the
views below, and check what they read on the mount against them.
"""
from __future__ import annotations

import hashlib
import json
import os
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


def writer_journal_path(workdir: Path, writer: int) -> Path:
    return workdir / f"journal-w{writer}.jsonl"


def snapshot_journal_path(workdir: Path) -> Path:
    return workdir / "snapshots.jsonl"


class Journal:
    """Appends records to a journal, each one whole line."""

    def __init__(self, path: Path) -> None:
        self.f = open(path, "a", buffering=1)  # line-buffered: every record reaches the file whole

    def rec(self, ev: str, **kw: Any) -> None:
        self.f.write(json.dumps({"ev": ev, **kw}) + "\n")

    def close(self) -> None:
        self.f.close()


class JournalTail:
    """Reads another process's journal incrementally (complete lines only)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.partial = b""

    def new_records(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self.offset += len(data)
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()
        return [json.loads(line) for line in lines if line]


class WriterView(JournalTail):
    """A writer's journal so far: every version it began per path, what is committed now."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.begun: dict[str, set[str]] = defaultdict(set)
        self.empty_ok: set[str] = set()  # created by open(): empty until the first close
        self.current: dict[str, str] = {}
        self.gone: Counter[str] = Counter()

    def refresh(self) -> WriterView:
        for r in self.new_records():
            path = r["path"]
            if r["ev"] == "begin":
                self.begun[path].add(r["sha"])
                if r["empty_ok"]:
                    self.empty_ok.add(path)
            elif r["ev"] == "commit":
                self.current[path] = r["sha"]
            elif r["ev"] == "gone":
                self.current.pop(path, None)
                self.gone[path] += 1
        return self

    def allowed(self, path: str) -> set[str]:
        """The contents `path` may show: a version begun for it, or empty while being created.
        safetensors' own `.tmp<random>` siblings are renamed away before their close, so they
        only ever show their empty create-version."""
        ok = set(self.begun.get(path, ()))
        if path in self.empty_ok:
            ok.add(EMPTY_SHA256)
        if not ok and os.path.basename(path).startswith(".tmp"):
            ok.add(EMPTY_SHA256)
        return ok


class RecordedSnapshotsView(JournalTail):
    """The controller's snapshot journal: the contents recorded when each snapshot was taken,
    and the snapshots being deleted (a read of one may find it gone)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.files: dict[str, dict[str, str]] = {}
        self.deleting: set[str] = set()

    def refresh(self) -> RecordedSnapshotsView:
        for r in self.new_records():
            if r["ev"] == "snap":
                self.files[r["name"]] = r["files"]
            elif r["ev"] == "deleting":
                self.deleting.add(r["name"])
        return self
