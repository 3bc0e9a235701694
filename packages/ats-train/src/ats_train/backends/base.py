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

    def shard_experts(self, model: nn.Module) -> None:
        """parallel.expert_parallel > 1 (ddp, fsdp2): keep this rank's experts of every MoE layer.
        Called on the plain model before the optimizer is built; nothing on the other backends."""
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

    def model_state(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """The plain model's full, unsharded state dict, for ats_train.model_state to write.

        Called on every rank (FSDP2 gathers shards, a collective); complete on the main rank."""
        ...

    def load_model(self, model: nn.Module, directory: Path) -> None:
        """Load a model directory written from any backend and world size."""
        ...

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, object]:
        """torch.optim's own state_dict layout (integer parameter ids), full and unsharded, so a
        checkpoint resumes on any backend and world size. Called on every rank."""
        ...

    def load_optimizer_state(
        self, optimizer: torch.optim.Optimizer, state: dict[str, object]
    ) -> None: ...

    def sharded_layout(self) -> dict[str, object]:
        """What save_optimizer_shards writes (checkpoint_sharded.py): writer ("safetensors"
        or "deepspeed"), backend, world_size (and zero_stage), JSON-ready; a resume checks it."""
        ...

    def save_optimizer_shards(self, optimizer: torch.optim.Optimizer, directory: Path) -> None:
        """checkpoint.format = "sharded": every rank writes its own shard of the optimizer state
        under directory (trainer_state/), never gathered. A collective."""
        ...

    def load_optimizer_shards(self, optimizer: torch.optim.Optimizer, directory: Path) -> None:
        """Every rank reads its part of what save_optimizer_shards wrote (checked resumable)."""
        ...

    def all_reduce_mean(self, value: float) -> float:
        """Mean of a scalar over ranks (metrics only)."""
        ...

    def all_reduce_mean_tensor(self, values: torch.Tensor) -> torch.Tensor:
        """Elementwise mean over ranks of a CPU tensor of the same shape on every rank (float64)."""
        ...

    def barrier(self) -> None:
        """Wait for every rank (after the main rank wrote a checkpoint)."""
        ...

    def close(self) -> None:
        """End of the run, on every rank: leave the process group."""
        ...
