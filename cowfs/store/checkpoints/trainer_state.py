"""HF Trainer checkpoints: a `checkpoint-N/` directory is complete once its
`trainer_state.json` is committed (Trainer._save_checkpoint writes it last), and that
file says what the checkpoint holds: its step, epoch and the metrics logged up to it."""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

CHECKPOINT_DIR = re.compile(r"^checkpoint-(\d+)$")  # transformers.trainer_utils._re_checkpoint
STATE_FILE = "trainer_state.json"
MAX_STATE_BYTES = 64 << 20  # a trainer_state.json larger than this is not read (log_history of very long runs)
NOT_METRICS = frozenset({"step", "epoch"})  # log_history keys that say when, not how well


def checkpoint_step(dir_name: str) -> int | None:
    """N of a directory named `checkpoint-N`, else None."""
    m = CHECKPOINT_DIR.match(dir_name)
    return int(m.group(1)) if m else None


@dataclass(frozen=True)
class TrainerState:
    """What `cowfs checkpoints` and `snapshot list` show of one trainer_state.json."""

    global_step: int
    epoch: float | None
    # numeric values of the log_history entries logged at `metrics_step` (the step of the
    # last entry: a training log and an evaluation at one step both count), later ones win
    metrics: dict[str, float] = field(default_factory=dict)
    metrics_step: int | None = None
    best_metric: float | None = None
    best_model_checkpoint: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"step": self.global_step, "epoch": self.epoch, "metrics": dict(self.metrics),
                "metrics_step": self.metrics_step, "best_metric": self.best_metric,
                "best_model_checkpoint": self.best_model_checkpoint}


def _number(value: object) -> float | None:
    """A finite int or float (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def parse_trainer_state(data: bytes) -> TrainerState:
    """Parse a trainer_state.json; ValueError (with the reason) if it is not one."""
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"not JSON ({e})") from None
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    step = doc.get("global_step")
    if isinstance(step, bool) or not isinstance(step, int):
        raise ValueError("no integer global_step")
    history = doc.get("log_history") or []
    if not isinstance(history, list):
        raise ValueError("log_history is not a list")
    entries = [e for e in history if isinstance(e, dict)]
    metrics: dict[str, float] = {}
    metrics_step = None
    if entries:
        last_step = entries[-1].get("step")
        metrics_step = last_step if isinstance(last_step, int) and not isinstance(last_step, bool) else None
        for entry in entries:
            if entry.get("step") != last_step:
                continue
            for key, value in entry.items():
                number = _number(value)
                if number is not None and key not in NOT_METRICS:
                    metrics[key] = number
    best = doc.get("best_model_checkpoint")
    return TrainerState(step, _number(doc.get("epoch")), metrics, metrics_step, _number(doc.get("best_metric")),
                        best if isinstance(best, str) else None)
