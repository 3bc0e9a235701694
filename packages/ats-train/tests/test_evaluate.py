"""Trainer.evaluate: the eval micro-batch changes how many forwards run, not the loss; with
train.eval_batches = 0 the loss is the whole val split's."""

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from ats_train.build import build_trainer
from ats_train.config import load_config
from ats_train.errors import ConfigError


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
        with build_trainer(config, run_dir) as trainer:
            forwards.append([])
            trainer.raw_model.register_forward_pre_hook(
                lambda _, args, seen=forwards[-1]: seen.append(len(args[0]))
            )
            losses.append(trainer.evaluate())
    assert forwards == [[2, 2, 2, 2], [8]]
    assert losses[1] == pytest.approx(losses[0], rel=1e-6)


def test_eval_sizes_out_of_range_are_refused(overrides) -> None:
    with pytest.raises(ConfigError, match="train.eval_micro_batch_size = 0 must be > 0"):
        load_config(None, overrides(train__eval_micro_batch_size=0))
    with pytest.raises(ConfigError, match=r"train.eval_batches = -1 must be >= 0 \(0 = the whole"):
        load_config(None, overrides(train__eval_batches=-1))


def test_whole_split_evaluation_is_the_mean_over_every_packed_val_window(
    overrides, tmp_path: Path
) -> None:
    """train.eval_batches = 0: the loss over every packed window of the val split, by hand."""
    extra = {"model__preset": "tiny-dense", "train__precision": "fp32", "train__eval_batches": 0}
    config = load_config(None, overrides(**extra))
    with build_trainer(config, tmp_path) as trainer:
        got = trainer.evaluate()
        T = config.train.seq_len
        windows = [
            torch.from_numpy(m[k * T : k * T + T + 1].astype(np.int64))
            for m in trainer.data.dataset.shards("val")
            for k in range((len(m) - 1) // T)
        ]
        assert len(windows) > config.train.micro_batch_size  # more than one forward
        batch = torch.stack(windows)
        trainer.raw_model.eval()
        with torch.no_grad():
            logits = trainer.raw_model(batch[:, :-1]).logits
        want = F.cross_entropy(logits.flatten(0, 1).double(), batch[:, 1:].flatten())
        assert got == pytest.approx(float(want), rel=1e-5)
