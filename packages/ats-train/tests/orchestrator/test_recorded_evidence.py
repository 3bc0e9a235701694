"""mod_collapse, prune_experts and split_expert judged on metrics recorded from real tiny runs
(recorded/*.json: the command that made each, and its train records cut to the keys these kinds
read). Healthy 200-step runs, where an untrained MoD predictor keeps almost no token for tens of
steps after warmup and experts dip under / rise over their limits for an evaluation or two, must
not fire them; a forced collapse (faults.mod_collapse_at_step, faults.dead_experts_at_step) must.

The replay is the orchestrator's: an evaluation every 10 steps after the 30-step warmup, each on
the last 20 train records (orchestrator.every, .window)."""

import json
import math
from pathlib import Path

import pytest
from ats_train.orchestrator.kinds.experts import Streak, beyond
from ats_train.orchestrator.kinds.mod import chance_loss, predictor_collapse
from ats_train.orchestrator.settings import (
    ModCollapseSettings,
    PruneExpertsSettings,
    SplitExpertSettings,
)

RECORDED = Path(__file__).parent / "recorded"
WARMUP, EVERY, WINDOW = 30, 10, 20
CAPACITY = 0.5  # tiny-mod and tiny-hybrid: one MoD layer at capacity 0.5


def train_records(name: str) -> list[dict]:
    return json.loads((RECORDED / f"{name}.json").read_text())["train_records"]


def windows(records: list[dict]) -> list[list[dict]]:
    last = records[-1]["step"]
    return [
        [r for r in records if r["step"] <= step][-WINDOW:]
        for step in range(WARMUP + EVERY, last + 1, EVERY)
    ]


def mod_fires(name: str) -> list[int]:
    return [
        w[-1]["step"]
        for w in windows(train_records(name))
        if predictor_collapse(w, [CAPACITY], ModCollapseSettings())
    ]


def expert_fires(name: str, settings, low: bool) -> list[int]:
    limit = settings.min_utilization if low else settings.max_utilization
    streak, fired = Streak(), []
    for w in windows(train_records(name)):
        if streak.update(w, beyond(w, limit, settings.sigmas, low)) >= settings.evaluations:
            fired.append(w[-1]["step"])
    return fired


def test_chance_loss_is_the_binary_entropy_of_the_keep_rate() -> None:
    assert chance_loss([0.5]) == pytest.approx(math.log(2))
    h = -(0.125 * math.log(0.125) + 0.875 * math.log(0.875))
    assert chance_loss([0.125, 0.125]) == pytest.approx(2 * h)  # summed as the model sums BCE


@pytest.mark.parametrize("name", ["tiny-mod-s2-healthy", "tiny-hybrid-s2-healthy"])
def test_untrained_predictor_is_not_a_collapse(name: str) -> None:
    records = train_records(name)
    # the healthy run does look like the old rule's collapse: under the 10% floor for tens of steps
    low = [
        r["step"] for r in records if r["step"] > WARMUP and r["mod/predictor_selected"][0] < 0.1
    ]
    assert len(low) > 40
    # ... with the predictor's loss at chance (ln 2) while it keeps nothing
    assert all(r["aux/mod_predictor"] > 0.9 * math.log(2) for r in records if 45 <= r["step"] <= 70)
    assert mod_fires(name) == []


def test_confidently_wrong_predictor_is_a_collapse() -> None:
    # pushed to "skip every token" at step 60: it keeps nothing and its loss is far above chance
    assert mod_fires("tiny-mod-s2-collapsed") == list(range(60, 121, 10))


def stuck(loss: float, kept: list[float]) -> list[dict]:
    return [
        {"step": s, "aux/mod_predictor": loss, "mod/predictor_selected": [k]}
        for s, k in enumerate(kept, 1)
    ]


def test_trained_predictor_stuck_under_the_floor_is_a_collapse() -> None:
    settings = ModCollapseSettings()  # floor 0.1 at capacity 0.5; chance ln 2, band 10%
    trained = 0.5  # below 0.9 ln 2
    assert predictor_collapse(stuck(trained, [0.02] * 20), [CAPACITY], settings)
    # too few records, a record at the floor, or the share still rising: not (yet) stuck
    assert predictor_collapse(stuck(trained, [0.02] * 19), [CAPACITY], settings) is None
    assert (
        predictor_collapse(stuck(trained, [0.02] * 9 + [0.1] + [0.02] * 10), [CAPACITY], settings)
        is None
    )
    rising = [0.0] * 7 + [0.02] * 6 + [0.05] * 7
    assert predictor_collapse(stuck(trained, rising), [CAPACITY], settings) is None
    # the same stuck share at chance is an untrained predictor
    assert predictor_collapse(stuck(math.log(2), [0.02] * 20), [CAPACITY], settings) is None


@pytest.mark.parametrize("name", ["tiny-hybrid-s2-healthy", "tiny-hybrid-s3-healthy"])
def test_healthy_expert_dips_do_not_prune_or_split(name: str) -> None:
    prune, split = PruneExpertsSettings(), SplitExpertSettings()
    # both runs have a window the old one-window rules acted on (seed 2: an expert at 3.15x its
    # fair share at step 80 and at 0.05x at step 60; seed 3: one under 0.1x at steps 140-150)
    means = [
        [u * 8 for u in layer]
        for w in windows(train_records(name))
        for layer in [[sum(r["moe/expert_fraction"][0][e] for r in w) / len(w) for e in range(8)]]
    ]
    assert any(min(m) < prune.min_utilization for m in means) or any(
        max(m) > split.max_utilization for m in means
    )
    assert expert_fires(name, prune, low=True) == []
    assert expert_fires(name, split, low=False) == []


def test_dead_experts_are_pruned() -> None:
    # the last 2 experts of each layer are biased off at step 40: from the 4th evaluation on under
    # 0.1x (steps 60, 70, 80, 90)
    assert expert_fires("tiny-hybrid-s2-dead-experts", PruneExpertsSettings(), low=True)[0] == 90
    # and their load lands on a few live ones, lastingly over 2.5x
    split = expert_fires("tiny-hybrid-s2-dead-experts", SplitExpertSettings(), low=False)
    assert split and split[0] == 100


def test_streak_restarts_after_a_change_or_another_expert() -> None:
    def records(first: int, last: int) -> list[dict]:
        return [{"step": s} for s in range(first, last + 1)]

    streak = Streak()
    assert streak.update(records(1, 20), {(0, 1)}) == 1
    assert streak.update(records(11, 30), {(0, 1), (0, 2)}) == 2
    assert streak.update(records(21, 40), {(0, 2)}) == 1  # a different expert: a new streak
    assert streak.update(records(41, 50), {(0, 2)}) == 1  # records restarted after a change
    assert streak.update(records(41, 60), set()) == 0
