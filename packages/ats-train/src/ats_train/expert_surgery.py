"""Removing and adding MoE experts in a live run, with the optimizer following the parameters.

MoEFFN.prune_experts / split_expert replace the router and expert parameters (dim 0 = expert).
Here the optimizer's param_groups are pointed at the new tensors and each parameter's state
(AdamW exp_avg / exp_avg_sq) is indexed exactly as the weights were, so a kept expert keeps its
moments and a split copy starts with its parent's. Every layer keeps the same expert count: the
checkpoint format has one ModelConfig.moe.n_experts.
"""

from __future__ import annotations

import torch
from torch import nn

EXPERT_PARAMS = ("router.weight", "experts.w1", "experts.w3", "experts.w2")


def _params(layer: nn.Module) -> list[nn.Parameter]:
    return [layer.get_parameter(name) for name in EXPERT_PARAMS]


def _follow(optimizer: torch.optim.Optimizer, old: nn.Parameter, new: nn.Parameter, index) -> None:
    """Point the optimizer at `new` and carry old's state rows new = old[index]."""
    for group in optimizer.param_groups:
        group["params"] = [new if p is old else p for p in group["params"]]
    state = optimizer.state.pop(old, None)
    if state is not None:
        optimizer.state[new] = {
            k: v[index].clone() if torch.is_tensor(v) and v.dim() > 0 else v
            for k, v in state.items()
        }


def _reindex(model: nn.Module, optimizer, per_layer: list[list[int]], edit) -> None:
    for layer, index in zip(model.moe_layers(), per_layer, strict=True):
        old = _params(layer)
        edit(layer, index)
        idx = torch.tensor(index, device=old[0].device)
        for before, after in zip(old, _params(layer), strict=True):
            _follow(optimizer, before, after, idx)
    model.config.moe.n_experts = len(per_layer[0])


def prune_experts(model: nn.Module, optimizer, keep: list[list[int]]) -> None:
    """Keep experts keep[i] in MoE layer i (equal counts); optimizer state follows."""
    if len({len(k) for k in keep}) != 1:
        raise ValueError(f"prune_experts: every layer must keep as many experts, got {keep}")
    _reindex(model, optimizer, keep, lambda layer, index: layer.prune_experts(index))


def split_experts(model: nn.Module, optimizer, experts: list[int], noise_std: float) -> None:
    """Append a copy of expert experts[i] to MoE layer i; the copy's optimizer state is its
    parent's. noise_std perturbs the copy's weights so the two can diverge."""
    layers = model.moe_layers()
    index = [list(range(layer.n_experts)) + [e] for layer, e in zip(layers, experts, strict=True)]

    def edit(layer: nn.Module, idx: list[int]) -> None:
        layer.split_expert(idx[-1], noise_std)

    _reindex(model, optimizer, index, edit)
