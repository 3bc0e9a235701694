"""Post-training objectives (train.objective = sft | dpo | grpo) on the pretraining Trainer.

The Trainer's step is unchanged: its loader yields (inputs, targets) Rows instead of token
tensors, and Trainer.losses hands each micro-batch to the objective, which returns the loss, the
model's aux losses (the trainer weights them, as in pretraining) and its metrics as statistics
(averaged over ranks and written to metrics.jsonl under TRL's names).

    start.py        model.init_from: config, weights, tokenizer (+ ChatML tokens, resized)
    examples.py     TRL-format rows -> token ids and loss masks
    batching.py     packing / padding, and the resumable ExampleLoader
    sft.py dpo.py grpo.py   the objectives; dpo_loss.py grpo_loss.py their math
    rewards.py      GRPO reward functions; reference.py the reference log-prob providers
    build.py        config -> loader and objective
"""

from typing import Any, Protocol

import torch
from torch import nn

from ats_train.objectives.rows import Rows


class Objective(Protocol):
    name: str
    # whether the loss falls as the run improves (the orchestrator's trend kinds judge it only
    # then): SFT and DPO yes; GRPO's is an advantage-weighted log-prob around 0
    loss_tracks_progress: bool

    def losses(
        self, model: nn.Module, x: Rows, y: Rows, step: int
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """One micro-batch: (loss, unweighted aux losses, scalar metrics)."""
        ...

    def evaluate(self, run: Any) -> dict[str, float]:
        """Validation over every rank's share; "loss" is what val_loss records."""
        ...
