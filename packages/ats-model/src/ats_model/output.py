"""ModelOutput: what a forward returns (logits, LM loss, unweighted aux losses, detached stats).

A NamedTuple, not a dataclass: engines that hook a module's output tensors find them only in
tuples, lists, dicts and namedtuples. DeepSpeed ZeRO-3 re-gathers a module's partitioned
parameters before its backward through such a hook; behind a dataclass the root's hook never
attached, and the fused loss's backward read the partitioned (empty) head weight under NVMe
parameter offload (`RuntimeError: The size of tensor a (0) must match the size of tensor b`).
"""

from typing import NamedTuple

import torch


class ModelOutput(NamedTuple):
    logits: torch.Tensor | None  # (B, T, V); None when the model fused the head into the loss
    loss: torch.Tensor | None  # mean CE over targets != -100; aux losses NOT included
    aux: dict[str, torch.Tensor]  # "moe_lb", "moe_z", "mod_predictor"
    stats: dict[str, torch.Tensor]  # "moe/...", "mod/..." (detached)
