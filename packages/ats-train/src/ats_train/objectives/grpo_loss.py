"""GRPO's math (Shao et al. 2024, DeepSeekMath), as TRL's GRPOTrainer computes it.

Advantages: each completion's reward minus its group's mean (G completions of one prompt),
divided by the group's std (scale "group"), the whole batch's std ("batch", Liu et al. 2025
recommend not scaling by the group) or not at all ("none"); std is unbiased, + 1e-4 as TRL.
Per token:  ratio = exp(logp - logp_old),  -min(ratio A, clip(ratio, 1 - eps, 1 + eps_high) A)
            + beta KL,  KL = exp(ref - logp) - (ref - logp) - 1  (k3 estimator, Schulman 2020)
Reduction:  grpo     mean over sequences of each sequence's token mean
            dr_grpo  sum over all tokens / (sequences * max completion length)  (Liu et al. 2025)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

SCALES = ("group", "batch", "none")
GRPO_LOSSES = ("grpo", "dr_grpo")
STD_EPS = 1e-4


def group_advantages(rewards: torch.Tensor, group_size: int, scale: str) -> torch.Tensor:
    """rewards (N * G,) in groups of G consecutive completions -> advantages (N * G,)."""
    if scale not in SCALES:
        raise ValueError(f"grpo scale {scale!r} is not one of {', '.join(SCALES)}")
    grouped = rewards.view(-1, group_size)  # (N, G)
    advantages = (grouped - grouped.mean(dim=1, keepdim=True)).reshape(-1)
    if scale == "group":
        std = grouped.std(dim=1).repeat_interleave(group_size)
    elif scale == "batch":
        std = rewards.std().expand_as(rewards)
    else:
        return advantages
    return advantages / (std + STD_EPS)


@dataclass
class GRPOTerms:
    loss: torch.Tensor
    clip_ratio: torch.Tensor  # share of completion tokens whose ratio the clip held (detached)
    kl: torch.Tensor  # mean per-token KL to the reference (0 without one)


def grpo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    epsilon: float,
    epsilon_high: float,
    loss_type: str = "grpo",
    beta: float = 0.0,
    ref_logp: torch.Tensor | None = None,
    max_completion_length: int | None = None,
) -> GRPOTerms:
    """logp, old_logp, ref_logp, mask (S, T) over completion tokens; advantages (S,)."""
    if loss_type not in GRPO_LOSSES:
        raise ValueError(f"grpo loss_type {loss_type!r} is not one of {', '.join(GRPO_LOSSES)}")
    mask = mask.to(logp.dtype)
    A = advantages[:, None]  # (S, 1)
    ratio = torch.exp(logp - old_logp)  # (S, T)
    clipped = torch.clamp(ratio, 1 - epsilon, 1 + epsilon_high)
    per_token = -torch.min(ratio * A, clipped * A)
    kl = torch.zeros_like(per_token)
    if beta != 0.0:
        if ref_logp is None:
            raise ValueError("grpo beta != 0 needs the reference log-probs")
        delta = ref_logp - logp
        kl = torch.exp(delta) - delta - 1
        per_token = per_token + beta * kl
    tokens = mask.sum().clamp(min=1)
    if loss_type == "grpo":
        loss = ((per_token * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)).mean()
    else:
        length = max_completion_length or mask.shape[1]
        loss = (per_token * mask).sum() / (mask.shape[0] * length)
    held = ((ratio < 1 - epsilon) & (A < 0)) | ((ratio > 1 + epsilon_high) & (A > 0))
    clip_ratio = (held.to(mask.dtype) * mask).sum() / tokens
    return GRPOTerms(loss, clip_ratio.detach(), ((kl * mask).sum() / tokens).detach())
