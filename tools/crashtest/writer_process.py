"""The harness's handle on one writer process: started ahead of its cycle (torch's import
takes seconds), its records as they arrive on the pipe, its durable log, its kill."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable

from .errors import HarnessError
from .subcommands import REPO_ROOT, WRITER, child_argv


class WriterProcess:
    """One writer process (tools/crashtest/writer.py), started ahead of its cycle."""

    def __init__(self, work: Path, logs: Path, root: Path, cycle: int, seed: int,
                 overwrite_safetensors: bool) -> None:
        self.cycle = cycle
        self.scratch = work / "scratch" / str(cycle)  # its own: the next writer starts beside it
        self.log = logs / f"writer-{cycle:03d}.jsonl"
        self.errpath = logs / f"writer-{cycle:03d}.err"
        self.records: list[tuple[float, dict]] = []  # (time received, record) as received on the pipe
        self.listeners: list[Callable[[dict], None]] = []
        self.ready = threading.Event()
        self.lock = threading.Lock()
        self.err = open(self.errpath, "wb")
        self.proc = subprocess.Popen(
            child_argv(WRITER, "--root", str(root), "--log", str(self.log), "--scratch", str(self.scratch),
                       "--seed", str(seed), "--ppid", str(os.getpid()))
            + (["--overwrite-safetensors"] if overwrite_safetensors else []),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err, start_new_session=True, cwd=REPO_ROOT)
        self.reader = threading.Thread(target=self._read, name=f"writer-{cycle}-pipe", daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                r = json.loads(line)
            except ValueError:
                continue
            with self.lock:
                self.records.append((time.monotonic(), r))
                listeners = list(self.listeners)
            if r["ev"] == "ready":
                self.ready.set()
            for fn in listeners:
                fn(r)

    def add_listener(self, fn: Callable[[dict], None]) -> None:
        """Call fn(record) for every record that arrives from now on (on the pipe's thread)."""
        with self.lock:
            self.listeners.append(fn)

    def go(self, step0: int) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"go {step0}\n".encode())
        self.proc.stdin.flush()

    def last_record(self) -> dict | None:
        with self.lock:
            return self.records[-1][1] if self.records else None

    def last_receipt(self) -> float:
        with self.lock:
            return self.records[-1][0] if self.records else 0.0

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            raise HarnessError(f"writer pid {self.proc.pid} did not die after SIGKILL within 30 s "
                               f"(stuck in the kernel: {Path(f'/proc/{self.proc.pid}/wchan').read_text()})")
        self.reader.join(timeout=10)
        shutil.rmtree(self.scratch, ignore_errors=True)
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                if f:
                    f.close()
            except OSError:
                pass
        self.err.close()

    def stderr_tail(self, n: int = 15) -> str:
        try:
            lines = self.errpath.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def file_records(self) -> list[dict]:
        """The durable log: every complete line."""
        out = []
        with open(self.log) as f:
            for line in f:
                if line.endswith("\n"):
                    out.append(json.loads(line))
        return out
