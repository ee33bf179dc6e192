"""Which snapshots a prune keeps: restic `forget` semantics, as a pure function of their times.

A snapshot survives if any rule keeps it:
  last N       the N newest
  within D     every snapshot taken within D of the newest one
  hourly N     the newest snapshot of each of the N newest hours that have one (UTC)
  daily N      ... of each of the N newest days
  weekly N     ... of each of the N newest ISO weeks
  name GLOB    every snapshot whose name matches
(and `--keep-best`, which ranks checkpoints by a metric: keep_best.py, applied after these)
"""
from __future__ import annotations

import datetime
import fnmatch
from dataclasses import dataclass, field
from typing import Callable

from ...errors import InvalidArgument
from ..catalog.snapshots import Snapshot


@dataclass(frozen=True)
class KeepPolicy:
    last: int = 0
    within_ns: int = 0
    hourly: int = 0
    daily: int = 0
    weekly: int = 0
    names: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.last or self.within_ns or self.hourly or self.daily or self.weekly or self.names)


@dataclass
class Decision:
    snapshot: Snapshot
    reasons: list[str] = field(default_factory=list)

    @property
    def keep(self) -> bool:
        return bool(self.reasons)


def _bucketed(decisions: list[Decision], n: int, key: Callable[[datetime.datetime], object], rule: str) -> None:
    seen: set[object] = set()
    for d in decisions:  # newest first
        if len(seen) >= n:
            break
        b = key(datetime.datetime.fromtimestamp(d.snapshot.created_ns / 1e9, datetime.timezone.utc))
        if b not in seen:
            seen.add(b)
            d.reasons.append(rule)


def plan(snapshots: list[Snapshot], policy: KeepPolicy, more_rules: bool = False) -> list[Decision]:
    """A decision per snapshot, newest first. `more_rules`: other rules (keep-best) will keep
    snapshots too, so an empty policy is not a refusal."""
    if policy.empty and not more_rules:
        raise InvalidArgument("no keep rule given: refusing to delete every snapshot")
    for rule, n in (("last", policy.last), ("hourly", policy.hourly), ("daily", policy.daily), ("weekly", policy.weekly)):
        if n < 0:  # a negative count is no rule, yet it would get past the refusal above
            raise InvalidArgument(f"--keep-{rule} must be 0 or more, not {n}")
    decisions = [Decision(s) for s in sorted(snapshots, key=lambda s: (s.created_ns, s.gen), reverse=True)]
    for d in decisions[: policy.last]:
        d.reasons.append(f"last {policy.last}")
    if policy.within_ns and decisions:
        newest = decisions[0].snapshot.created_ns
        for d in decisions:
            if newest - d.snapshot.created_ns <= policy.within_ns:
                d.reasons.append("within")
    if policy.hourly:
        _bucketed(decisions, policy.hourly, lambda t: (t.year, t.month, t.day, t.hour), f"hourly {policy.hourly}")
    if policy.daily:
        _bucketed(decisions, policy.daily, lambda t: t.date(), f"daily {policy.daily}")
    if policy.weekly:
        _bucketed(decisions, policy.weekly, lambda t: t.isocalendar()[:2], f"weekly {policy.weekly}")
    for pattern in policy.names:
        for d in decisions:
            if fnmatch.fnmatchcase(d.snapshot.name, pattern):
                d.reasons.append(f"name {pattern}")
    return decisions
