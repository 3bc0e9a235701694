"""Trainer.evaluate: the eval micro-batch changes how many forwards run, not the loss."""

from pathlib import Path

import pytest
from ats_train.config import load_config
from ats_train.errors import ConfigError
from ats_train.trainer import build_trainer


@pytest.mark.parametrize("preset", ["tiny-dense", "tiny-moe"])
def test_one_large_eval_forward_gives_the_micro_batched_loss(
    overrides, tmp_path: Path, preset: str
) -> None:
    """2 global batches of 4 windows, evaluated 2 at a time (the training micro-batch) or all 8
    in one forward: the same windows, the same token-weighted mean (dropless MoE: no capacity)."""
    losses, forwards = [], []
    for eval_micro in (None, 8):
        extra = {"model__preset": preset, "train__precision": "fp32"}
        if eval_micro is not None:
            extra["train__eval_micro_batch_size"] = eval_micro
        config = load_config(None, overrides(**extra))
        assert config.train.micro_batch_size == 2 and config.train.eval_batches == 2
        run_dir = tmp_path / f"run-{eval_micro}"
        run_dir.mkdir()
        trainer = build_trainer(config, run_dir)
        forwards.append([])
        trainer.raw_model.register_forward_pre_hook(
            lambda _, args, seen=forwards[-1]: seen.append(len(args[0]))
        )
        losses.append(trainer.evaluate())
        trainer.metrics.close()
    assert forwards == [[2, 2, 2, 2], [8]]
    assert losses[1] == pytest.approx(losses[0], rel=1e-6)


def test_eval_micro_batch_size_must_be_positive(overrides) -> None:
    with pytest.raises(ConfigError, match="train.eval_micro_batch_size = 0 must be > 0"):
        load_config(None, overrides(train__eval_micro_batch_size=0))
