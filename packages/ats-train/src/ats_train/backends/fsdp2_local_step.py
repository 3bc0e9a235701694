"""FSDP2's gradient clipping and optimizer update on each rank's local shards, as plain tensors.

FSDP2 leaves every parameter, gradient and optimizer state a DTensor sharded on dim 0, and clipping
and AdamW on DTensors go through DTensor's Python dispatch. The trainer reads the loss on the host
before each update, so the GPU has drained by the time the update is launched and waits for that
dispatch: on 2 H200s (124m-dense, all blocks in one unit, compiled, 32 sequences per rank) the
host ran `Optimizer.step` for 5.0 ms and the norm's `_foreach_norm` / `stack` / `vector_norm` for
3.7 ms per step inside the GPU's idle gaps. On the local shards the same work costs the plain
tensors' launches: weak-scaling efficiency 83.2-83.6% -> 86.1% (BENCHMARKS.md,
Distributed).

Both are elementwise over each rank's own rows: the global gradient norm is the square root of
the all-reduced sum of the ranks' squared local norms, the clip scales the local gradients, and a
second instance of the run's optimizer (same class, groups and hyperparameters, fused on CUDA)
updates the local parameters in place. The DTensor optimizer stays the one the trainer and
checkpoints see (lr from the schedule, state_dict, DCP, full-state gather): its state entries are
DTensors over the local optimizer's state storage, so what the update writes is what a checkpoint
reads.

With expert parallelism the optimizer also holds each rank's expert shards, plain parameters
outside FSDP2 (fsdp2.py): their "local shard" is the parameter itself, and since `copies` ranks
hold the same shard, its squared norm enters the all-reduced sum divided by `copies`.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from ats_train.backends.guarded_step import step_if_finite


class LocalShardStep:
    """step() for an optimizer over FSDP2's DTensor parameters, run on their local shards."""

    def __init__(
        self, optimizer: torch.optim.Optimizer, device: torch.device, copies: int = 1
    ) -> None:
        self.optimizer, self.device, self.copies = optimizer, device, copies
        self._params: list[torch.Tensor] = [p for g in optimizer.param_groups for p in g["params"]]
        with torch.no_grad():  # leaf views of the shards: in-place updates reach the DTensors
            self._local = [p.to_local() if isinstance(p, DTensor) else p for p in self._params]
        local_of = {id(p): lp for p, lp in zip(self._params, self._local, strict=True)}
        groups = [
            {**_hyperparameters(g), "params": [local_of[id(p)] for p in g["params"]]}
            for g in optimizer.param_groups
        ]
        defaults = optimizer.defaults
        self.local_optimizer = type(optimizer)(
            groups, fused=defaults.get("fused"), foreach=defaults.get("foreach")
        )

    def step(self, grad_clip: float) -> tuple[float, bool]:
        """Clip to grad_clip (0: no clip) by the global norm and update unless it is not finite.
        Returns (global gradient norm, whether the update ran), the same on every rank."""
        for p, lp in zip(self._params, self._local, strict=True):
            if lp is not p:
                lp.grad = None if p.grad is None else p.grad.to_local()
        for local_group, group in zip(
            self.local_optimizer.param_groups, self.optimizer.param_groups, strict=True
        ):
            local_group.update(_hyperparameters(group))  # the schedule sets lr on the DTensor one
        local_sq = self._local_squares()
        total_sq = local_sq.to(self.device)  # CPUOffloadPolicy keeps grads off the NCCL device
        dist.all_reduce(total_sq)  # the sum over ranks of squared local norms
        norm = total_sq.sqrt().to(local_sq.device)
        if grad_clip > 0:
            torch.nn.utils.clip_grads_with_norm_(self._local, grad_clip, norm)
        self._share_state()
        grad_norm, stepped = step_if_finite(self.local_optimizer, norm)
        self.local_optimizer.zero_grad(set_to_none=True)
        self._share_state()
        return grad_norm, stepped

    def _local_squares(self) -> torch.Tensor:
        """This rank's part of the squared global gradient norm: its DTensor shards' squares and
        its plain (expert) parameters' squares over the ranks holding the same ones."""
        sharded = [lp.grad for p, lp in zip(self._params, self._local, strict=True) if lp is not p]
        plain = [p.grad for p, lp in zip(self._params, self._local, strict=True) if lp is p]
        squares = torch.nn.utils.get_total_norm([g for g in sharded if g is not None]).square()
        plain = [g for g in plain if g is not None]
        if plain:
            plain_sq = torch.nn.utils.get_total_norm(plain).square().to(squares.device)
            squares = squares + plain_sq / self.copies
        return squares

    def _share_state(self) -> None:
        """One state per parameter, seen by both optimizers: state the DTensor optimizer holds
        (loaded from a checkpoint, or made by torch's state-dict API before any step) is updated
        through its local shards; state the first update made gets DTensor views."""
        local_state = self.local_optimizer.state
        for p, lp in zip(self._params, self._local, strict=True):
            if lp in local_state:
                if p not in self.optimizer.state:
                    self.optimizer.state[p] = {
                        k: _as_dtensor(v, p)
                        if lp is not p and torch.is_tensor(v) and v.shape == lp.shape
                        else v
                        for k, v in local_state[lp].items()
                    }
            elif p in self.optimizer.state:
                local_state[lp] = {
                    k: v.to_local() if isinstance(v, DTensor) else v
                    for k, v in self.optimizer.state[p].items()
                }


def _hyperparameters(group: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in group.items() if k != "params"}


def _as_dtensor(local: torch.Tensor, like: DTensor) -> DTensor:
    """A DTensor over `local` (no copy) sharded as `like` is, with its global shape."""
    return DTensor.from_local(
        local, like.device_mesh, like.placements, run_check=False,
        shape=like.shape, stride=like.stride(),
    )  # fmt: skip
