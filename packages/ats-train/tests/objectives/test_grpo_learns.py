"""GRPO raises the reward it is trained on: `ats-train grpo` end to end (trainer, orchestrator in its
default mode, micro-batches) on the tiny base model, with a dense reward that random completions
already score on (the share of digits in the completion), so that every group has an advantage to
learn from. The objective's math is checked against TRL elsewhere (test_losses.py); this checks
that the whole loop moves the policy the right way."""

import json
from pathlib import Path

from ats_train.cli import main

from conftest import post_overrides


def digit_share(prompts: list[str], completions: list[str], **_: object) -> list[float]:
    return [sum(c.isdigit() for c in text) / max(len(text), 1) for text in completions]


def test_grpo_raises_its_reward(base_model, rows_file, tmp_path, monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    run = tmp_path / "run"
    overrides = post_overrides(
        base_model,
        rows_file("grpo"),
        grpo__rewards=json.dumps(["test_grpo_learns:digit_share"]),
        grpo__group_size=8,
        grpo__max_completion_tokens=16,
        train__steps=60,
        train__batch_size=8,
        train__micro_batch_size=8,
        train__eval_every=0,
        checkpoint__every=0,
        optim__lr=1e-3,
        optim__min_lr=1e-3,
        optim__warmup_steps=0,
        optim__weight_decay=0.0,
    )
    assert main(["grpo", "--run-dir", str(run), *overrides]) == 0
    rewards = [
        r["reward"]
        for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
        if "reward" in r and r.get("kind", "train") == "train"
    ]
    assert len(rewards) == 60
    first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
    assert last > first + 0.08, (first, last, rewards)
