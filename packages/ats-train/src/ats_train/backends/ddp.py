"""`ddp`: torch DistributedDataParallel; every rank holds the whole model, gradients are averaged.

Launched by torchrun (gloo on CPU, NCCL on CUDA). Gradient accumulation skips the all-reduce on
all but the last micro-batch (no_sync). Weights and optimizer state are replicated, so saving is
the single backend's format written by rank 0 from the unwrapped model; it loads on any world
size. checkpoint.format = "sharded" writes the optimizer state as single does (optimizer_shards.py;
the replicas are written once), resumable by single, ddp and fsdp2 on any world size.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ats_train.backends.process_group import (
    all_reduce_mean,
    all_reduce_mean_tensor,
    average_expert_biases,
    join_process_group,
    leave_process_group,
)
from ats_train.backends.single import SingleBackend
from ats_train.precision import Precision


class DDPBackend(SingleBackend):
    name = "ddp"

    def __init__(self, device: torch.device, precision: Precision) -> None:
        info = join_process_group(self.name, device)
        super().__init__(info.device, precision)
        self.rank, self.world_size = info.rank, info.world_size
        self._ddp: DistributedDataParallel | None = None
        self._plain: nn.Module | None = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def wrap(
        self, model: nn.Module, optimizer: torch.optim.Optimizer
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        super().wrap(model, optimizer)
        self._plain = model
        # broadcast_buffers=False: rank 0's buffers would overwrite the others' every forward;
        # the only trained buffer, MoE expert_bias, is averaged after each step instead.
        # gradient_as_bucket_view: .grad are views into the all-reduce buckets, so gradients are
        # neither copied into nor held beside them (one fp32 copy of the model less per rank).
        self._ddp = DistributedDataParallel(
            model,
            device_ids=[self.device.index] if self.device.type == "cuda" else None,
            broadcast_buffers=False,
            gradient_as_bucket_view=True,
        )
        return self._ddp, optimizer

    def backward(self, loss: torch.Tensor, *, last_micro_batch: bool) -> None:
        if last_micro_batch:
            super().backward(loss, last_micro_batch=True)
            return
        with self._ddp.no_sync():  # accumulate locally; the last micro-batch all-reduces the sum
            super().backward(loss, last_micro_batch=False)

    def step(self, optimizer: torch.optim.Optimizer, grad_clip: float) -> tuple[float, bool]:
        grad_norm, stepped = super().step(optimizer, grad_clip)
        average_expert_biases(self._plain)
        return grad_norm, stepped

    def all_reduce_mean(self, value: float) -> float:
        return all_reduce_mean(value, self.device)

    def all_reduce_mean_tensor(self, values: torch.Tensor) -> torch.Tensor:
        return all_reduce_mean_tensor(values, self.device)

    def barrier(self) -> None:
        dist.barrier()

    def close(self) -> None:
        leave_process_group()
