"""The DPO family of preference losses on summed sequence log-probabilities, as TRL computes them.

    h = (log pi(y_w|x) - log pi(y_l|x)) - (log ref(y_w|x) - log ref(y_l|x))
    sigmoid  -log sigmoid(beta h)                 Rafailov et al. 2023 (DPO)
    hinge    max(0, 1 - beta h)                   Zhao et al. 2023 (SLiC)
    ipo      (h - 1 / (2 beta))^2, on log-probs   Azar et al. 2023 (IPO); TRL averages the
             averaged over each sequence's tokens  log-probs over tokens for ipo, and so do we
Implicit rewards (logged): beta (log pi - log ref) of chosen and rejected."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

DPO_LOSSES = ("sigmoid", "ipo", "hinge")


@dataclass
class DPOTerms:
    loss: torch.Tensor  # scalar, mean over pairs
    chosen_rewards: torch.Tensor  # (P,) detached
    rejected_rewards: torch.Tensor  # (P,) detached

    def metrics(self) -> dict[str, torch.Tensor]:
        """TRL's names: rewards/chosen, rewards/rejected, rewards/margins, rewards/accuracies."""
        c, r = self.chosen_rewards, self.rejected_rewards
        return {
            "rewards/chosen": c.mean(),
            "rewards/rejected": r.mean(),
            "rewards/margins": (c - r).mean(),
            "rewards/accuracies": (c > r).to(c.dtype).mean(),
        }


def dpo_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    beta: float,
    loss_type: str = "sigmoid",
) -> DPOTerms:
    """Each input (P,): the sequence log-probability of a pair's completion (summed over its
    tokens; for ipo, averaged over them: the caller passes what the loss type needs)."""
    if loss_type not in DPO_LOSSES:
        raise ValueError(f"dpo loss {loss_type!r} is not one of {', '.join(DPO_LOSSES)}")
    h = (policy_chosen - policy_rejected) - (ref_chosen - ref_rejected)  # (P,)
    if loss_type == "sigmoid":
        losses = -F.logsigmoid(beta * h)
    elif loss_type == "hinge":
        losses = torch.relu(1 - beta * h)
    else:
        losses = (h - 1 / (2 * beta)) ** 2
    chosen = beta * (policy_chosen - ref_chosen).detach()
    rejected = beta * (policy_rejected - ref_rejected).detach()
    return DPOTerms(losses.mean(), chosen, rejected)
