"""Where DPO and GRPO get the reference policy's log-probabilities: the `Reference` interface.

FrozenReference holds a frozen copy of the initial weights (model.init_from).
AdapterDisabledReference needs no second model: under train.trainable = "lora" the base weights
never change, so the training model with its adapters switched off is the initial policy. DPO can instead precompute every pair's reference log-probs once (dpo.reference =
"precomputed"), after which no reference model stays in memory."""

from __future__ import annotations

from typing import Protocol

import torch
from ats_model.adapters import disabled_adapter
from torch import nn

from ats_train.objectives.logprobs import forward_logprobs


class Reference(Protocol):
    def token_logprobs(
        self, ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor
    ) -> torch.Tensor:
        """(B, T) log-probs of labels (0 where labels == -100), without gradients."""
        ...


class FrozenReference:
    """A separate, frozen model (eval mode: no dropout, no MoE bias updates)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model.eval().requires_grad_(False)

    @torch.no_grad()
    def token_logprobs(
        self, ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor
    ) -> torch.Tensor:
        return forward_logprobs(self.model, ids, attention_mask, labels)[0]


class AdapterDisabledReference:
    """The training model itself with every LoRA adapter off, run in eval mode (no dropout, no MoE
    bias updates) and put back in its previous mode afterwards."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    @torch.no_grad()
    def token_logprobs(
        self, ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor
    ) -> torch.Tensor:
        training = self.model.training
        self.model.eval()
        try:
            with disabled_adapter(self.model):
                return forward_logprobs(self.model, ids, attention_mask, labels)[0]
        finally:
            self.model.train(training)
