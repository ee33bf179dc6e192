"""trainer_state.json parsing, metric specs and the keep-best plan, as pure functions (no store)."""
from __future__ import annotations

import json

import pytest

from cowfs.errors import InvalidArgument
from cowfs.store import Snapshot
from cowfs.store.checkpoints.keep_best import Candidate, MetricSpec, keep_best, ranked
from cowfs.store.checkpoints.trainer_state import parse_trainer_state
from cowfs.store.upkeep.retention import Decision, KeepPolicy, plan


def state(step: int, history: list[dict], **extra: object) -> bytes:
    return json.dumps({"global_step": step, "epoch": step / 10, "log_history": history, **extra}).encode()


def test_trainer_state_metrics_are_those_logged_at_the_last_step():
    s = parse_trainer_state(state(20, [
        {"loss": 2.0, "step": 10, "epoch": 1.0},
        {"eval_loss": 1.9, "step": 10},
        {"loss": 1.5, "grad_norm": 0.3, "learning_rate": 1e-4, "step": 20, "epoch": 2.0},
        {"eval_loss": 1.4, "eval_accuracy": 0.7, "eval_runtime": 0.5, "step": 20, "epoch": 2.0},
    ], best_metric=1.4, best_model_checkpoint="out/checkpoint-20"))
    assert s.global_step == 20 and s.epoch == 2.0 and s.metrics_step == 20
    assert s.metrics == {"loss": 1.5, "grad_norm": 0.3, "learning_rate": 1e-4, "eval_loss": 1.4,
                         "eval_accuracy": 0.7, "eval_runtime": 0.5}
    assert s.best_metric == 1.4 and s.best_model_checkpoint == "out/checkpoint-20"
    j = s.to_json()
    assert j["step"] == 20 and j["metrics"]["eval_loss"] == 1.4


def test_trainer_state_keeps_only_finite_numbers():
    s = parse_trainer_state(b'{"global_step": 3, "log_history": [{"loss": NaN, "x": true, "acc": 0.5, '
                            b'"note": "hi", "step": 3}]}')
    assert s.metrics == {"acc": 0.5} and s.epoch is None
    assert parse_trainer_state(state(5, [])).metrics == {}


@pytest.mark.parametrize("data, reason", [
    (b"{not json", "not JSON"), (b"[1]", "not a JSON object"), (b'{"epoch": 1}', "global_step"),
    (b'{"global_step": true}', "global_step"), (b'{"global_step": 1, "log_history": 3}', "log_history"),
    (b"\xff\xfe", "not JSON"),
])
def test_trainer_state_errors(data, reason):
    with pytest.raises(ValueError, match=reason):
        parse_trainer_state(data)


def test_metric_specs():
    assert MetricSpec.parse("eval_loss") == MetricSpec("eval_loss", False)
    assert MetricSpec.parse("eval_accuracy:max") == MetricSpec("eval_accuracy", True)
    assert MetricSpec.parse("train_Loss:max").higher_is_better
    for bad, message in (("eval_accuracy", "say whether lower or higher"), ("eval_loss:mid", "bad metric"),
                         (":min", "bad metric"), ("", "bad metric")):
        with pytest.raises(InvalidArgument, match=message):
            MetricSpec.parse(bad)


# -- keep-best: snapshots s1 (oldest) .. s5, checkpoints a..e with their eval_loss -----------------


SNAPS = [Snapshot(f"s{i}", i * 10, i * 1000) for i in range(1, 6)]
CKPTS = [  # key, step, eval_loss, snapshots holding it, own snapshot
    (1, 100, 0.9, ("s1", "s2"), "s1"),
    (2, 200, 0.4, ("s2", "s3", "s4"), "s2"),
    (3, 300, 0.6, ("s3", "s4", "s5"), "s3"),
    (4, 400, 0.4, ("s4", "s5"), "s4"),     # ties with 2: the higher step ranks first
    (5, 500, 0.8, ("s5",), "s5"),
]


def candidates() -> list[Candidate]:
    held_with = {s.name: sum(s.name in c[3] for c in CKPTS) for s in SNAPS}
    return [Candidate(k, step, f"/r/checkpoint-{step}", {"eval_loss": v, "acc": 1 - v}, snaps, own, held_with)
            for k, step, v, snaps, own in CKPTS]


def decide(policy: KeepPolicy, spec: str, n: int) -> tuple[list[Decision], list]:
    decisions = plan(SNAPS, policy, more_rules=True)
    return decisions, keep_best(decisions, candidates(), MetricSpec.parse(spec), n)


def reasons(decisions: list[Decision]) -> dict[str, list[str]]:
    return {d.snapshot.name: d.reasons for d in decisions if d.reasons}


def test_keep_best_keeps_each_best_checkpoints_own_snapshot():
    decisions, best = decide(KeepPolicy(), "eval_loss", 3)
    # 400's own snapshot s4 holds 200 too: kept once for both; 300's own is s3
    assert [(b.rank, b.step, b.snapshot) for b in best] == [(1, 400, "s4"), (2, 200, "s4"), (3, 300, "s4")]
    assert reasons(decisions) == {"s4": ["best eval_loss #1 (0.4, step 400)", "best eval_loss #2 (0.4, step 200)",
                                         "best eval_loss #3 (0.6, step 300)"]}
    decisions, best = decide(KeepPolicy(), "eval_loss:max", 2)  # 100 (own s1), then 500 (own s5)
    assert [(b.step, b.snapshot) for b in best] == [(100, "s1"), (500, "s5")]


def test_keep_best_uses_a_snapshot_another_rule_keeps():
    decisions, best = decide(KeepPolicy(last=1), "acc:max", 2)  # s5 kept by last 1 holds 400 (acc 0.6)
    assert [(b.step, b.snapshot) for b in best] == [(400, "s5"), (200, "s2")]
    assert reasons(decisions) == {"s5": ["last 1", "best acc #1 (0.6, step 400)"], "s2": ["best acc #2 (0.6, step 200)"]}
    assert sorted(d.snapshot.name for d in decisions if d.keep) == ["s2", "s5"]


def test_keep_best_without_an_own_snapshot_keeps_the_one_holding_fewest():
    cands = [Candidate(9, 900, "/r/checkpoint-900", {"eval_loss": 0.1}, ("s3", "s4", "s5"), None,
                       {"s3": 3, "s4": 2, "s5": 2})]
    decisions = plan(SNAPS, KeepPolicy(), more_rules=True)
    best = keep_best(decisions, cands, MetricSpec.parse("eval_loss"), 3)  # fewer candidates than N: all of them
    assert [b.snapshot for b in best] == ["s5"]  # s4 and s5 hold 2; the newer wins


def test_keep_best_errors():
    decisions = plan(SNAPS, KeepPolicy(), more_rules=True)
    with pytest.raises(InvalidArgument, match="no checkpoint in a snapshot has the metric 'eval_acc'.*acc, eval_loss"):
        keep_best(decisions, candidates(), MetricSpec.parse("eval_acc:max"), 1)
    with pytest.raises(InvalidArgument, match="at least 1"):
        keep_best(decisions, candidates(), MetricSpec.parse("eval_loss"), 0)
    with pytest.raises(InvalidArgument, match="no snapshot holds an HF Trainer checkpoint"):
        keep_best(decisions, [], MetricSpec.parse("eval_loss"), 1)
    with pytest.raises(InvalidArgument, match="no keep rule"):
        plan(SNAPS, KeepPolicy())


def test_ranked_leaves_out_checkpoints_without_the_metric():
    cands = candidates() + [Candidate(6, 600, "/r/checkpoint-600", {"loss": 0.01}, ("s5",), None)]
    assert [c.step for c in ranked(cands, MetricSpec.parse("eval_loss"))] == [400, 200, 300, 500, 100]
