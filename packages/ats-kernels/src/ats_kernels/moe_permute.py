"""Token permutation for MoE: group token copies by expert, and the weighted combine back (reference).

Slot s = token * k + j is the j-th expert choice of a token. `sort_order[i]` is the slot whose copy
sits at row i of x_sorted; rows are grouped by expert, slots in ascending order within an expert.
"""

import torch


def ref_moe_permute(
    x: torch.Tensor, indices: torch.Tensor, n_experts: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x (N, C), indices (N, k) -> (x_sorted (N*k, C), tokens_per_expert (E,) int64, sort_order (N*k,))."""
    top_k = indices.shape[1]
    flat = indices.reshape(-1)  # (N*k,) expert of each slot
    sort_order = torch.argsort(flat, stable=True)  # (N*k,)
    tokens_per_expert = torch.bincount(flat, minlength=n_experts)
    if tokens_per_expert.numel() != n_experts:
        raise ValueError(f"moe_permute: an expert index is >= n_experts = {n_experts}")
    x_sorted = x[sort_order // top_k]  # (N*k, C)
    return x_sorted, tokens_per_expert.to(torch.int64), sort_order


def ref_moe_unpermute(
    y_sorted: torch.Tensor, sort_order: torch.Tensor, weights: torch.Tensor
) -> torch.Tensor:
    """y_sorted (N*k, C), weights (N, k) -> (N, C): sum_j weights[n, j] * y of slot (n, j)."""
    n_tokens, top_k = weights.shape
    y_slots = torch.empty_like(y_sorted)
    y_slots[sort_order] = y_sorted  # back to slot order (N*k, C)
    y_slots = y_slots.view(n_tokens, top_k, -1)  # (N, k, C)
    return (y_slots * weights.unsqueeze(-1).to(y_slots.dtype)).sum(dim=1)
