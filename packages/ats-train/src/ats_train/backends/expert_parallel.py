"""Expert parallelism (`parallel.expert_parallel = N`): each MoE layer's E experts split over the N
ranks of an expert-parallel group, E/N consecutive experts per rank; tokens travel to the rank
holding their expert and back through all-to-all (GShard, Lepikhin et al. 2020, section 2.2).

Routing, capacity and the aux losses stay the model's, computed on the rank's own batch as without
parallelism; only the expert MLPs run elsewhere. Ranks are grouped as

    world 4, N = 2:   EP groups {0, 1} {2, 3}   (all-to-all)
                      replica groups {0, 2} {1, 3}   (the same experts: gradients summed)

Gradients of the local experts arrive summed over the EP group's losses (the all-to-all's
backward); reduce_expert_grads sums them over the replicas and divides by the world size, the mean
that data parallelism takes of every other gradient.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.distributed as dist
from torch import nn

EXPERT_WEIGHTS = ("w1", "w3", "w2")  # Experts' stacked parameters, dim 0 = expert


class _AllToAll(torch.autograd.Function):
    """Rows x (sum(in_splits), C): in_splits[d] rows go to rank d of `group`, out_splits[s] rows
    come from rank s. Backward sends the gradients back the same way reversed."""

    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group):  # noqa: ANN001, ANN205
        ctx.splits, ctx.group = (out_splits, in_splits), group
        return _all_to_all(x, out_splits, in_splits, group)

    @staticmethod
    def backward(ctx, grad):  # noqa: ANN001, ANN205
        out_splits, in_splits = ctx.splits
        return _all_to_all(grad, in_splits, out_splits, ctx.group), None, None, None


def _all_to_all(
    x: torch.Tensor, out_splits: list[int], in_splits: list[int], group: dist.ProcessGroup
) -> torch.Tensor:
    out = x.new_empty(sum(out_splits), *x.shape[1:])
    dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
    return out


def all_to_all(
    x: torch.Tensor, out_splits: list[int], in_splits: list[int], group: dist.ProcessGroup
) -> torch.Tensor:
    """Differentiable all_to_all_single with split sizes (gloo and NCCL both have it)."""
    return _AllToAll.apply(x, out_splits, in_splits, group)


class ExpertExchange:
    """ats_model's ExpertExchange for one rank of an EP group of `size` ranks:

    x_sorted (M, C) grouped by global expert --dispatch--> rows of my E/N experts from every rank,
    regrouped expert-major --local_mlp--> back to source-major --combine--> (M, C) in M's order.
    """

    def __init__(self, group: dist.ProcessGroup, size: int) -> None:
        self.group, self.size = group, size

    def __call__(
        self,
        x_sorted: torch.Tensor,
        per_expert: torch.Tensor,
        local_mlp: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    ) -> torch.Tensor:
        n_ranks = self.size
        n_local = per_expert.numel() // n_ranks
        send = per_expert.view(n_ranks, n_local)  # (N, E/N) my rows for each rank's experts
        recv = torch.empty_like(send)  # (N, E/N) each rank's rows for my experts
        dist.all_to_all_single(recv, send.contiguous(), group=self.group)
        counts = torch.stack([send.sum(1), recv.sum(1)]).tolist()  # one host sync for both
        in_splits, out_splits = counts
        x_recv = all_to_all(x_sorted, out_splits, in_splits, self.group)  # (R, C) source-major
        # rows arrive as (source s, local expert e) chunks; local_mlp wants them expert-major
        chunk = torch.arange(n_local, device=recv.device) * n_ranks  # e * N
        key = (chunk[None, :] + torch.arange(n_ranks, device=recv.device)[:, None]).flatten()
        order = torch.argsort(torch.repeat_interleave(key, recv.flatten()), stable=True)  # (R,)
        y_local = local_mlp(x_recv[order], recv.sum(0))  # (R, C) expert-major
        y_recv = y_local[torch.argsort(order)]  # (R, C) source-major again
        return all_to_all(y_recv, in_splits, out_splits, self.group)  # (M, C)


@dataclass(frozen=True)
class ExpertParallel:
    size: int  # N: ranks per EP group
    rank: int  # this rank's place in its EP group: it holds experts rank*E/N .. (rank+1)*E/N-1
    group: dist.ProcessGroup  # the EP group (all-to-all)
    replicas: dist.ProcessGroup | None  # ranks holding the same experts; None when world = N


def build_expert_parallel(size: int) -> ExpertParallel:
    """The groups of `size` consecutive ranks (size divides the world: check_expert_parallel);
    every rank calls it (new_group is a collective)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    if size == world:
        return ExpertParallel(size, rank, dist.group.WORLD, None)
    group = replicas = None
    for first in range(0, world, size):
        ranks = list(range(first, first + size))
        made = dist.new_group(ranks)
        if rank in ranks:
            group = made
    for offset in range(size):
        ranks = list(range(offset, world, size))
        made = dist.new_group(ranks)
        if rank in ranks:
            replicas = made
    return ExpertParallel(size, rank % size, group, replicas)


class ShardedExperts(NamedTuple):
    ep: ExpertParallel
    names: list[str]  # this rank's expert shards, by state-dict name
    params: list[nn.Parameter]  # the same, as parameters (kept out of data-parallel reduction)


def shard_experts(model: nn.Module, size: int) -> ShardedExperts:
    """Every MoE layer keeps this rank's E/size experts; the rest are reached by all-to-all.
    Every rank calls it (it makes the groups: build_expert_parallel)."""
    ep = build_expert_parallel(size)
    for layer in model.moe_layers():
        n_local = layer.n_experts // ep.size
        layer.experts.shard(ep.rank * n_local, n_local, ExpertExchange(ep.group, ep.size))
    names = expert_parameter_names(model)
    params = dict(model.named_parameters())
    return ShardedExperts(ep, names, [params[name] for name in names])


def expert_parameter_names(model: nn.Module) -> list[str]:
    """Qualified names of the sharded expert weights (kept out of data-parallel reduction)."""
    names = {id(getattr(layer.experts, w)) for layer in model.moe_layers() for w in EXPERT_WEIGHTS}
    return [name for name, p in model.named_parameters() if id(p) in names]


def reduce_expert_grads(params: list[nn.Parameter], ep: ExpertParallel) -> None:
    """Sum over the replicas, then divide by the world size (see the module docstring)."""
    world = dist.get_world_size()
    for p in params:
        if p.grad is None:
            continue
        if ep.replicas is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM, group=ep.replicas)
        p.grad /= world


def clip_grad_norm(
    dense: list[nn.Parameter], experts: list[nn.Parameter], max_norm: float, ep: ExpertParallel
) -> torch.Tensor:
    """clip_grad_norm_ over the whole model: the dense gradients are the same on every rank, each
    expert shard's only on its holders, so the expert squares are summed over the EP group."""
    device = (dense + experts)[0].device

    def squares(params: list[nn.Parameter]) -> torch.Tensor:
        grads = [p.grad for p in params if p.grad is not None]
        if not grads:
            return torch.zeros((), device=device)
        return torch.nn.utils.get_total_norm(grads).float().square()

    expert_sq = squares(experts)
    dist.all_reduce(expert_sq, op=dist.ReduceOp.SUM, group=ep.group)
    norm = (squares(dense) + expert_sq).sqrt()
    torch.nn.utils.clip_grads_with_norm_(dense + experts, max_norm, norm)
    return norm


# ---- checkpoints: full expert tensors in every saved state, whatever the layout --------------


def _gather(local: torch.Tensor, ep: ExpertParallel) -> torch.Tensor:
    """The EP group's shards of one expert tensor, concatenated in expert order (a collective)."""
    parts = [torch.empty_like(local) for _ in range(ep.size)]
    dist.all_gather(parts, local.detach().contiguous(), group=ep.group)
    return torch.cat(parts)


def _slice(full: torch.Tensor, ep: ExpertParallel) -> torch.Tensor:
    n_local = full.shape[0] // ep.size
    return full[ep.rank * n_local : (ep.rank + 1) * n_local]


def full_model_state(
    state: dict[str, torch.Tensor], names: list[str], ep: ExpertParallel
) -> dict[str, torch.Tensor]:
    """`state` (a sharded model's state dict) with every expert weight in `names` gathered whole."""
    return {k: _gather(v, ep) if k in names else v for k, v in state.items()}


def gather_experts(
    model: nn.Module, names: list[str], ep: ExpertParallel
) -> dict[str, torch.Tensor]:
    """{name: the whole expert tensor} of the sharded expert weights `names` (a collective)."""
    params = dict(model.named_parameters())
    return {name: _gather(params[name], ep) for name in names}


def full_model_shapes(
    state: dict[str, torch.Tensor], names: list[str], ep: ExpertParallel
) -> dict[str, torch.Tensor]:
    """What a saved model directory holds for this sharded model: meta tensors of the full shape."""
    return {
        k: v.new_empty((v.shape[0] * ep.size, *v.shape[1:]), device="meta") if k in names else v
        for k, v in state.items()
    }


def local_model_state(
    full: dict[str, torch.Tensor], names: list[str], ep: ExpertParallel
) -> dict[str, torch.Tensor]:
    """A full model state with every expert weight in `names` cut to this rank's experts."""
    return {k: _slice(v, ep) if k in names else v for k, v in full.items()}


def _expert_ids(optimizer: torch.optim.Optimizer, experts: list[nn.Parameter]) -> set[int]:
    """The optimizer's state-dict ids (positions over its param groups) of the expert weights."""
    mine = {id(p) for p in experts}
    params = [p for group in optimizer.param_groups for p in group["params"]]
    return {i for i, p in enumerate(params) if id(p) in mine}


def full_optimizer_state(
    optimizer: torch.optim.Optimizer, experts: list[nn.Parameter], ep: ExpertParallel
) -> dict[str, object]:
    """optimizer.state_dict() with each expert weight's per-element state (Adam's moments)
    gathered whole; scalars such as `step` as they are. A collective: every rank calls it."""
    saved = optimizer.state_dict()
    ids = _expert_ids(optimizer, experts)
    state = {}
    for i, values in saved["state"].items():
        if i in ids:
            values = {k: _gather(v, ep) if v.ndim > 0 else v for k, v in values.items()}
        state[i] = values
    return {**saved, "state": state}


def gather_expert_state(
    optimizer: torch.optim.Optimizer, experts: dict[str, nn.Parameter], ep: ExpertParallel
) -> dict[str, dict[str, torch.Tensor]]:
    """{name: optimizer state} of the expert shards `experts` (by name) with every per-element
    entry gathered whole; scalars such as `step` as they are. A collective."""
    return {
        name: {k: _gather(v, ep) if v.ndim > 0 else v for k, v in optimizer.state[p].items()}
        for name, p in experts.items()
        if p in optimizer.state
    }


def slice_expert_state(
    state: dict[int, dict[str, torch.Tensor]], ids: set[int], ep: ExpertParallel
) -> dict[int, dict[str, torch.Tensor]]:
    """An optimizer state_dict's "state" (integer ids) with the full state of the expert weights
    `ids` cut to this rank's experts."""
    return {
        i: {k: _slice(v, ep) if v.ndim > 0 else v for k, v in values.items()}
        if int(i) in ids
        else values
        for i, values in state.items()
    }


def local_optimizer_state(
    optimizer: torch.optim.Optimizer,
    experts: list[nn.Parameter],
    full: dict[str, object],
    ep: ExpertParallel,
) -> dict[str, object]:
    """A full optimizer state (full_optimizer_state's layout, from any layout) cut to this rank's
    experts."""
    ids = _expert_ids(optimizer, experts)
    return {**full, "state": slice_expert_state(full["state"], ids, ep)}
