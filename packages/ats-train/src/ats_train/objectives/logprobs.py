"""Per-token log-probabilities of given labels under a model: what DPO and GRPO optimise.

Rows are right-padded; labels (B, T) hold the token each position predicts, -100 where nothing
counts (prompt, padding). The model runs once over the padded ids with its key-padding mask."""

from __future__ import annotations

import torch
from torch import nn

IGNORE = -100


def label_logprobs(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """logits (B, T, V), labels (B, T) -> (B, T) log p(label) in float32 or wider, 0 where
    labels == -100."""
    mask = labels != IGNORE
    logp = torch.log_softmax(logits.float() if logits.dtype.itemsize < 4 else logits, dim=-1)
    picked = logp.gather(-1, labels.clamp(min=0)[..., None])[..., 0]  # (B, T)
    return picked * mask


def forward_logprobs(
    model: nn.Module, ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor
) -> tuple[torch.Tensor, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """One forward: ((B, T) label log-probs, aux losses, stats) of right-padded rows."""
    out = model(ids, attention_mask=attention_mask)
    return label_logprobs(out.logits, labels), out.aux, out.stats


def shifted_labels(ids: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """ids (B, T) and loss_mask (B, T) (1 on the tokens to score) -> labels (B, T): position t
    predicts ids[t + 1], kept where loss_mask[t + 1] is 1, -100 elsewhere and at the last slot."""
    labels = torch.full_like(ids, IGNORE)
    labels[:, :-1] = torch.where(loss_mask[:, 1:].bool(), ids[:, 1:], IGNORE)
    return labels
