"""DPO: one forward over each pair's chosen and rejected rows (TRL's concatenated forward), the
reference's log-probs from a Reference or precomputed, and the loss of dpo_loss.py."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ats_train.objectives.batching import Batch
from ats_train.objectives.dpo_loss import dpo_loss
from ats_train.objectives.logprobs import IGNORE, forward_logprobs
from ats_train.objectives.reference import Reference
from ats_train.objectives.rows import Rows
from ats_train.objectives.sft import LossParts


def sequence_logps(token_logps: torch.Tensor, labels: torch.Tensor, average: bool) -> torch.Tensor:
    """(2P, T) per-token log-probs -> (P, 2) per sequence: summed, or averaged (ipo)."""
    total = token_logps.sum(dim=1)
    if average:
        total = total / (labels != IGNORE).sum(dim=1).clamp(min=1)
    return total.view(-1, 2)


@torch.no_grad()
def precompute_reference(
    reference: Reference, batches: list[Batch], device: torch.device
) -> torch.Tensor:
    """(P, 2) summed reference log-probs of every pair, in batch order, on the CPU."""
    out = []
    for x, y in batches:
        ids, mask = x["ids"].flatten(0, 1).to(device), x["attention_mask"].flatten(0, 1).to(device)
        labels = y["labels"].flatten(0, 1).to(device)
        out.append(sequence_logps(reference.token_logprobs(ids, mask, labels), labels, False).cpu())
    return torch.cat(out)


class DPOObjective:
    name = "dpo"
    loss_tracks_progress = True

    def __init__(
        self, beta: float, loss_type: str, reference: Reference | None, val_batches: list[Batch]
    ) -> None:
        self.beta, self.loss_type = beta, loss_type
        self.reference = reference  # None: every batch carries precomputed ref_logps
        self.val_batches = val_batches

    def losses(self, model: nn.Module, x: Rows, y: Rows, step: int) -> LossParts:
        del step
        ids, mask = x["ids"].flatten(0, 1), x["attention_mask"].flatten(0, 1)  # (2P, T)
        labels = y["labels"].flatten(0, 1)  # (2P, T)
        token_logps, aux, stats = forward_logprobs(model, ids, mask, labels)
        average = self.loss_type == "ipo"
        policy = sequence_logps(token_logps, labels, average)  # (P, 2)
        if self.reference is None:
            ref = y["ref_logps"]
            if average:
                ref = ref / (y["labels"] != IGNORE).sum(dim=2).clamp(min=1)
        else:
            ref = sequence_logps(self.reference.token_logprobs(ids, mask, labels), labels, average)
        terms = dpo_loss(
            policy[:, 0], policy[:, 1], ref[:, 0], ref[:, 1], self.beta, self.loss_type
        )
        metrics = {k: v.float() for k, v in terms.metrics().items()}
        return terms.loss, aux, {**stats, **metrics}

    @torch.no_grad()
    def evaluate(self, run: Any) -> dict[str, float]:
        """Mean loss and preference accuracy (rewards/accuracies) over the val pairs."""
        sums = torch.zeros(3, dtype=torch.float64)
        for x, y in self.val_batches:
            x, y = x.to(run.backend.device), y.to(run.backend.device)
            with run.forward_context():
                loss, _, stats = self.losses(run.model, x, y, 0)
            n = len(x)
            sums += torch.tensor([float(loss) * n, float(stats["rewards/accuracies"]) * n, n])
        loss, acc, n = run.backend.all_reduce_mean_tensor(sums).tolist()
        return {"loss": loss / n, "rewards/accuracies": acc / n}
