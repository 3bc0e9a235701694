"""`single`: one process, one device. The reference backend the distributed ones must reproduce."""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import nn

from ats_train.backends.guarded_step import queue_step_if_finite, step_if_finite
from ats_train.backends.optimizer_shards import load_optimizer_shards, save_optimizer_shards
from ats_train.checkpoint import CheckpointError
from ats_train.checkpoint_sharded import SHARDS_DIR
from ats_train.model_state import read_model_state
from ats_train.precision import Precision


class SingleBackend:
    name = "single"
    rank = 0
    world_size = 1

    def __init__(self, device: torch.device, precision: Precision) -> None:
        self.device = device
        self.precision = precision
        self._params: list[nn.Parameter] = []
        self._model: nn.Module | None = None  # the plain model (ddp: the one inside the wrapper)

    @property
    def is_main(self) -> bool:
        return True

    def wrap(
        self, model: nn.Module, optimizer: torch.optim.Optimizer
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        self._params = [p for p in model.parameters() if p.requires_grad]
        self._model = model
        return model, optimizer

    def backward(self, loss: torch.Tensor, *, last_micro_batch: bool) -> None:
        scaler = self.precision.scaler
        if scaler is not None:
            scaler.scale(loss).backward()
        else:
            loss.backward()

    def step(self, optimizer: torch.optim.Optimizer, grad_clip: float) -> tuple[float, bool]:
        scaler = self.precision.scaler
        if scaler is None:
            grad_norm = float(self.queue_step(optimizer, grad_clip))  # the wait, update queued
            return grad_norm, math.isfinite(grad_norm)
        scaler.unscale_(optimizer)
        max_norm = grad_clip if grad_clip > 0 else math.inf
        grad_norm = float(self.clip_grads(max_norm))
        # GradScaler skips the step itself when it found inf/NaN and lowers the scale.
        scale_before = scaler.get_scale()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        return grad_norm, scaler.get_scale() >= scale_before

    def queue_step(self, optimizer: torch.optim.Optimizer, grad_clip: float) -> torch.Tensor:
        """`step` without reading the result: returns the gradients' global norm as a tensor; a
        fused optimizer skips a non-finite update on the device. A non-fused one (CPU) needs the
        verdict on the host, where waiting for the device costs nothing. No fp16 loss scaler
        (train.overlap_host refuses fp16)."""
        if self.precision.scaler is not None:
            raise RuntimeError("queue_step: the fp16 loss scaler decides on the host")
        max_norm = grad_clip if grad_clip > 0 else math.inf
        norm = self.clip_grads(max_norm)
        if optimizer.defaults.get("fused"):
            queue_step_if_finite(optimizer, norm)
        else:
            step_if_finite(optimizer, norm)
        optimizer.zero_grad(set_to_none=True)
        return norm

    def clip_grads(self, max_norm: float) -> torch.Tensor:
        """Once per step, after backward (and the fp16 unscale): scale the gradients to a global
        norm <= max_norm; returns the norm before. (ddp: the sharded experts' gradients are
        reduced here first.)"""
        return torch.nn.utils.clip_grad_norm_(self._params, max_norm)

    def shard_experts(self, model: nn.Module) -> None:
        """Expert parallelism's sharding, before the optimizer is built: nothing here (config
        refuses parallel.expert_parallel > 1 but with ddp or fsdp2)."""
        return None

    def state(self) -> dict[str, object]:
        scaler = self.precision.scaler
        return {"scaler": scaler.state_dict() if scaler is not None else None}

    def load_state(self, state: dict[str, object]) -> None:
        scaler = self.precision.scaler
        saved = state["scaler"]
        if (scaler is None) != (saved is None):
            raise CheckpointError(
                f"checkpoint was written {'with' if saved is not None else 'without'} an fp16 loss "
                f"scaler; this run uses precision {self.precision.name!r}"
            )
        if scaler is not None:
            scaler.load_state_dict(saved)

    def model_state(self, model: nn.Module) -> dict[str, torch.Tensor]:
        return dict(model.state_dict())

    def load_model(self, model: nn.Module, directory: Path) -> None:
        model.load_state_dict(read_model_state(dict(model.state_dict()), directory), strict=True)

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, object]:
        return optimizer.state_dict()

    def load_optimizer_state(
        self, optimizer: torch.optim.Optimizer, state: dict[str, object]
    ) -> None:
        optimizer.load_state_dict(state)

    def sharded_layout(self) -> dict[str, object]:
        return {"writer": "safetensors", "backend": self.name, "world_size": self.world_size}

    def save_optimizer_shards(self, optimizer: torch.optim.Optimizer, directory: Path) -> None:
        save_optimizer_shards(self._model, optimizer, directory / SHARDS_DIR, self.rank)

    def load_optimizer_shards(self, optimizer: torch.optim.Optimizer, directory: Path) -> None:
        load_optimizer_shards(self._model, optimizer, directory / SHARDS_DIR, self.rank)

    def all_reduce_mean(self, value: float) -> float:
        return value

    def all_reduce_mean_tensor(self, values: torch.Tensor) -> torch.Tensor:
        return values

    def barrier(self) -> None:
        return None

    def close(self) -> None:
        return None
