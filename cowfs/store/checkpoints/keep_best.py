"""`prune --keep-best METRIC[:min|max] N`: keep the N best checkpoints by a metric, on top of
the time and name rules (retention.py), as a pure function of the candidates.

A candidate is a checkpoint some snapshot holds, with the metrics of its trainer_state.json.
The N best (ties: the higher step first) are kept by keeping one snapshot that holds each:
one that is kept already (by another rule, or for a better checkpoint: its own snapshot
first, else the newest), else its own snapshot (the one taken for it by --snapshot-on,
where it is the newest checkpoint), else the snapshot holding it that holds the fewest
checkpoints (the newest of those). So no snapshot is kept that the N best do not need.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from ...errors import InvalidArgument
from ..upkeep.retention import Decision

MIN, MAX = "min", "max"


@dataclass(frozen=True)
class MetricSpec:
    name: str
    higher_is_better: bool

    @classmethod
    def parse(cls, spec: str) -> "MetricSpec":
        """`METRIC`, `METRIC:min` or `METRIC:max`. Without a direction, a metric whose name
        contains "loss" is better lower; any other must say (trainer_state.json does not
        record greater_is_better: it is a TrainingArguments field)."""
        name, sep, way = spec.rpartition(":")
        if not sep:
            name, way = spec, ""
        if not name or (sep and way not in (MIN, MAX)):
            raise InvalidArgument(f"bad metric {spec!r}: expected METRIC, METRIC:min or METRIC:max")
        if not way:
            if "loss" not in name.lower():
                raise InvalidArgument(f"metric {name!r}: say whether lower or higher is better: {name}:min or "
                                      f"{name}:max (only names containing 'loss' default to min)")
            way = MIN
        return cls(name, way == MAX)

    @property
    def label(self) -> str:
        return f"{self.name}:{MAX if self.higher_is_better else MIN}"

    def order(self, value: float) -> float:
        """Sort key: smaller is better."""
        return -value if self.higher_is_better else value


@dataclass(frozen=True)
class Candidate:
    key: int                          # the checkpoint's identity (index.Checkpoint.key)
    step: int
    path: str
    metrics: Mapping[str, float]
    snapshots: tuple[str, ...]        # the snapshots that hold it
    own_snapshot: str | None = None   # the snapshot where it is the newest checkpoint
    held_with: Mapping[str, int] = field(default_factory=dict)  # snapshot -> checkpoints it holds


@dataclass(frozen=True)
class Best:
    rank: int
    metric: str
    value: float
    key: int
    step: int
    path: str
    snapshot: str  # the snapshot kept for it

    @property
    def reason(self) -> str:
        return f"best {self.metric} #{self.rank} ({self.value:.6g}, step {self.step})"

    def to_json(self) -> dict[str, object]:
        return {"rank": self.rank, "metric": self.metric, "value": self.value, "step": self.step, "path": self.path,
                "snapshot": self.snapshot}


def ranked(candidates: list[Candidate], spec: MetricSpec) -> list[Candidate]:
    """The candidates that have the metric, best first (ties: the higher step first)."""
    having = [c for c in candidates if spec.name in c.metrics]
    return sorted(having, key=lambda c: (spec.order(c.metrics[spec.name]), -c.step))


def keep_best(decisions: list[Decision], candidates: list[Candidate], spec: MetricSpec, n: int) -> list[Best]:
    """Add a reason to one snapshot per checkpoint among the `n` best; returns them, best first."""
    if n < 1:
        raise InvalidArgument(f"--keep-best {spec.name}: N must be at least 1, not {n}")
    by_name = {d.snapshot.name: d for d in decisions}
    held = [c for c in candidates if any(s in by_name for s in c.snapshots)]
    if not held:
        raise InvalidArgument("--keep-best: no snapshot holds an HF Trainer checkpoint (checkpoint-N/trainer_state.json)")
    best = ranked(held, spec)
    if not best:
        seen = sorted({m for c in held for m in c.metrics})
        raise InvalidArgument(f"--keep-best: no checkpoint in a snapshot has the metric {spec.name!r} "
                              f"(their metrics: {', '.join(seen) or 'none'})")
    out: list[Best] = []
    for rank, c in enumerate(best[:n], 1):
        names = [s for s in c.snapshots if s in by_name]
        kept = [s for s in names if by_name[s].keep]
        if kept:
            chosen = c.own_snapshot if c.own_snapshot in kept else max(kept, key=lambda s: by_name[s].snapshot.gen)
        elif c.own_snapshot in names:
            chosen = c.own_snapshot
        else:
            chosen = min(names, key=lambda s: (c.held_with.get(s, 0), -by_name[s].snapshot.gen))
        b = Best(rank, spec.name, c.metrics[spec.name], c.key, c.step, c.path, chosen)
        by_name[chosen].reasons.append(b.reason)
        out.append(b)
    return out
