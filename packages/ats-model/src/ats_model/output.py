"""ModelOutput: what a forward returns (logits, LM loss, unweighted aux losses, detached stats)."""

from dataclasses import dataclass, field

import torch


@dataclass
class ModelOutput:
    logits: torch.Tensor | None  # (B, T, V); None when the model fused the head into the loss
    loss: torch.Tensor | None = None  # mean CE over targets != -100; aux losses NOT included
    aux: dict[str, torch.Tensor] = field(default_factory=dict)  # "moe_lb", "moe_z", "mod_predictor"
    stats: dict[str, torch.Tensor] = field(default_factory=dict)  # "moe/...", "mod/..." (detached)
