"""`ddp`: torch DistributedDataParallel; every rank holds the whole model, gradients are averaged.

Launched by torchrun (gloo on CPU, NCCL on CUDA). Gradient accumulation skips the all-reduce on
all but the last micro-batch (no_sync). Weights and optimizer state are replicated, so saving is
the single backend's format written by rank 0 from the unwrapped model; it loads on any world
size. checkpoint.format = "sharded" writes the optimizer state as single does (optimizer_shards.py;
the replicas are written once), resumable by single, ddp and fsdp2 on any world size.

parallel.expert_parallel = N shards every MoE layer's experts over groups of N ranks
(expert_parallel.py): DDP reduces the rest, the experts are reduced apart, and checkpoints hold
full expert tensors, so a run resumes at any N (and on single).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ats_train.backends.expert_parallel import (
    ExpertParallel,
    clip_grad_norm,
    full_model_shapes,
    full_model_state,
    full_optimizer_state,
    local_model_state,
    local_optimizer_state,
    reduce_expert_grads,
    shard_experts,
)
from ats_train.backends.process_group import (
    all_reduce_mean,
    all_reduce_mean_tensor,
    average_expert_biases,
    join_process_group,
    leave_process_group,
)
from ats_train.backends.single import SingleBackend
from ats_train.checkpoint import CheckpointError
from ats_train.model_state import read_model_state
from ats_train.precision import Precision


class DDPBackend(SingleBackend):
    name = "ddp"

    def __init__(
        self, device: torch.device, precision: Precision, expert_parallel: int = 1
    ) -> None:
        info = join_process_group(self.name, device)
        super().__init__(info.device, precision)
        self.rank, self.world_size = info.rank, info.world_size
        self._ddp: DistributedDataParallel | None = None
        self._plain: nn.Module | None = None
        self.expert_parallel = expert_parallel  # N; the groups are made by shard_experts
        self._ep: ExpertParallel | None = None
        self._expert_names: list[str] = []  # the sharded weights, by state-dict name
        self._experts: list[nn.Parameter] = []

    def shard_experts(self, model: nn.Module) -> None:
        if self.expert_parallel == 1:
            return
        self._ep, self._expert_names, self._experts = shard_experts(model, self.expert_parallel)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def wrap(
        self, model: nn.Module, optimizer: torch.optim.Optimizer
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        super().wrap(model, optimizer)
        self._plain = model
        if self._ep is not None:  # each rank's own experts: reduced by clip_grads, not by DDP
            experts = {id(p) for p in self._experts}  # named as the wrapper (compile) names them
            ignored = [name for name, p in model.named_parameters() if id(p) in experts]
            DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, ignored)
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

    def clip_grads(self, max_norm: float) -> torch.Tensor:
        if self._ep is None:
            return super().clip_grads(max_norm)
        reduce_expert_grads(self._experts, self._ep)  # what DDP's all-reduce did for the rest
        experts = {id(p) for p in self._experts}
        dense = [p for p in self._params if id(p) not in experts]
        trained = [p for p in self._params if id(p) in experts]
        return clip_grad_norm(dense, trained, max_norm, self._ep)

    def model_state(self, model: nn.Module) -> dict[str, torch.Tensor]:
        state = dict(model.state_dict())
        if self._ep is None:
            return state
        return full_model_state(state, self._expert_names, self._ep)

    def load_model(self, model: nn.Module, directory: Path) -> None:
        if self._ep is None:
            return super().load_model(model, directory)
        names, ep = self._expert_names, self._ep
        expected = full_model_shapes(dict(model.state_dict()), names, ep)
        full = read_model_state(expected, directory)
        model.load_state_dict(local_model_state(full, names, ep), strict=True)

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, object]:
        if self._ep is None:
            return super().optimizer_state(optimizer)
        return full_optimizer_state(optimizer, self._experts, self._ep)

    def load_optimizer_state(
        self, optimizer: torch.optim.Optimizer, state: dict[str, object]
    ) -> None:
        if self._ep is not None:
            state = local_optimizer_state(optimizer, self._experts, state, self._ep)
        optimizer.load_state_dict(state)

    def load_optimizer_shards(self, optimizer: torch.optim.Optimizer, directory: Path) -> None:
        if self._ep is not None:
            raise CheckpointError(
                f"{directory}: a checkpoint.format = 'sharded' checkpoint resumes with "
                f"parallel.expert_parallel = 1, not {self.expert_parallel}"
            )
        super().load_optimizer_shards(optimizer, directory)

    def all_reduce_mean(self, value: float) -> float:
        return all_reduce_mean(value, self.device)

    def all_reduce_mean_tensor(self, values: torch.Tensor) -> torch.Tensor:
        return all_reduce_mean_tensor(values, self.device)

    def barrier(self) -> None:
        dist.barrier()

    def close(self) -> None:
        leave_process_group()
