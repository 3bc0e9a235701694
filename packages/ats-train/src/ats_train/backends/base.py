"""The interface every parallel backend implements; the trainer only talks to this.

A backend owns what differs between single-device, DDP, FSDP2, DeepSpeed and ColossalAI: how model
and optimizer are wrapped, how the loss is backpropagated (loss scaling, no_sync during gradient
accumulation), how an optimizer step is taken (unscale, clip, step), how model and optimizer state
are saved and loaded, and which rank this process is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import torch
from torch import nn


class Backend(Protocol):
    name: str
    rank: int
    world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        """True on the rank that writes metrics, checkpoints and the final model."""
        ...

    def wrap(
        self, model: nn.Module, optimizer: torch.optim.Optimizer
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        """Model and optimizer as this backend trains them."""
        ...

    def backward(self, loss: torch.Tensor, *, last_micro_batch: bool) -> None:
        """Backpropagate one micro-batch's (already 1/n_micro scaled) loss."""
        ...

    def step(self, optimizer: torch.optim.Optimizer, grad_clip: float) -> tuple[float, bool]:
        """Clip (0 = measure only) and step; returns (grad norm before clipping, step taken)."""
        ...

    def state(self) -> dict[str, object]:
        """Backend-owned training state (e.g. the fp16 loss scaler), JSON-ready."""
        ...

    def load_state(self, state: dict[str, object]) -> None: ...

    def save_model(self, model: nn.Module, directory: Path, tokenizer_json: Path | None) -> None:
        """Write the model directory (config.json, model.safetensors, tokenizer.json)."""
        ...

    def load_model(self, model: nn.Module, directory: Path) -> None: ...

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, object]: ...

    def load_optimizer_state(
        self, optimizer: torch.optim.Optimizer, state: dict[str, object]
    ) -> None: ...

    def all_reduce_mean(self, value: float) -> float:
        """Mean of a scalar over ranks (metrics only)."""
        ...
