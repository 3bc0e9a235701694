"""RunHandle: all the orchestrator sees of a training run. It reads the step, the settings it may
change, the model's structure and parameters and the optimizer's groups; it asks for changes as
records (changes.py), which the run applies. The Trainer is behind it (ats_train/run_handle.py);
this package never imports the trainer.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from ats_train.orchestrator.changes import RunChange

if TYPE_CHECKING:
    from ats_train.batch_geometry import BatchGeometry


class StepLoss(Protocol):
    loss: float  # the step's mean LM loss over ranks


class StepSums(Protocol):
    """A step's loss sums, still on the device: the orchestrator hands them back unread."""


class Collectives(Protocol):
    """What the parameter statistics need of the backend."""

    world_size: int
    device: torch.device

    def all_reduce_mean_tensor(self, tensor: torch.Tensor) -> torch.Tensor: ...


class RunHandle(Protocol):
    @property
    def step(self) -> int: ...  # optimizer steps taken

    @property
    def run_dir(self) -> Path: ...

    @property
    def model(self) -> nn.Module: ...  # the plain ats_model module: read it, change it by records

    @property
    def collectives(self) -> Collectives: ...

    @property
    def batch(self) -> BatchGeometry: ...  # global batch, per-rank batch, micro-batch, accumulation

    @property
    def flops_per_token(self) -> float: ...

    def setting(self, key: str) -> Any:
        """The run's current value of a dotted config key, e.g. "optim.grad_clip"."""
        ...

    @property
    def loss_tracks_progress(self) -> bool: ...  # False: the loss is not judged as a trend

    def weight_decays(self) -> list[float]:
        """weight_decay of each optimizer param group, in order."""
        ...

    def latest_checkpoint(self) -> Path | None: ...

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor) -> StepSums: ...

    def release_failed_step(self) -> None:
        """After an out-of-memory step: drop its gradients and cached blocks before the retry."""
        ...

    def apply(self, change: RunChange) -> None:
        """Carry out one change now."""
        ...
