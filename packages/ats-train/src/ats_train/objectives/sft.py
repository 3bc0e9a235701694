"""SFT: the model's own cross-entropy on completion / assistant tokens only (labels -100
elsewhere), over packed rows (document_ids) or padded rows (attention_mask)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ats_train.objectives.batching import Batch
from ats_train.objectives.logprobs import IGNORE
from ats_train.objectives.rows import Rows

LossParts = tuple[torch.Tensor, dict[str, torch.Tensor], dict[str, torch.Tensor]]


class SFTObjective:
    name = "sft"
    loss_tracks_progress = True

    def __init__(self, val_batches: list[Batch]) -> None:
        self.val_batches = val_batches  # this rank's share of the val rows

    def losses(self, model: nn.Module, x: Rows, y: Rows, step: int) -> LossParts:
        del step
        inputs = {k: v for k, v in x.items() if k != "ids"}  # document_ids or attention_mask
        out = model(x["ids"], targets=y["labels"], **inputs)
        tokens = (y["labels"] != IGNORE).sum().to(torch.float32)
        return out.loss, out.aux, {**out.stats, "completion_tokens": tokens}

    @torch.no_grad()
    def evaluate(self, run: Any) -> dict[str, float]:
        """Token-weighted mean CE over the val rows of every rank."""
        loss_sum, tokens = 0.0, 0
        for x, y in self.val_batches:
            x, y = x.to(run.backend.device), y.to(run.backend.device)
            with run.forward_context():
                loss, _, stats = self.losses(run.model, x, y, 0)
            n = int(stats["completion_tokens"])
            loss_sum += float(loss) * n
            tokens += n
        total = run.backend.all_reduce_mean(loss_sum)
        return {"loss": total / max(run.backend.all_reduce_mean(tokens), 1e-12)}
