"""MoE routing: softmax with temperature, top-k expert choice per token, per-expert counts (reference)."""

import torch


def ref_moe_route(
    logits: torch.Tensor,
    top_k: int,
    temperature: float = 1.0,
    bias: torch.Tensor | None = None,
    norm_topk: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """logits (N, E) -> (weights (N, k) in logits.dtype, indices (N, k) int64, probs (N, E) fp32,
    counts (E,) int64: routed slots per expert).

    `bias` (E,) only shifts the choice, never the weights (DeepSeek-V3 aux-loss-free balancing,
    arXiv:2412.19437 section 2.1.2). With norm_topk the k weights are renormalized to sum to 1.
    """
    n_experts = logits.shape[-1]
    if not 1 <= top_k <= n_experts:
        raise ValueError(f"moe_route: top_k = {top_k} must be in [1, n_experts = {n_experts}]")
    if not temperature > 0:
        raise ValueError(f"moe_route: temperature = {temperature} must be > 0")
    compute_dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    probs = torch.softmax(logits.to(compute_dtype) / temperature, dim=-1)  # (N, E)
    scores = probs if bias is None else probs + bias.to(compute_dtype)
    indices = torch.topk(scores.detach(), top_k, dim=-1).indices  # (N, k)
    weights = probs.gather(-1, indices)  # (N, k)
    if norm_topk:
        weights = weights / weights.sum(-1, keepdim=True)
    return weights.to(logits.dtype), indices, probs, expert_counts(indices, n_experts)


def expert_counts(indices: torch.Tensor, n_experts: int) -> torch.Tensor:
    """indices (any shape) -> (E,) int64 slots per expert. torch.bincount would read the maximum
    index on the host (a stream sync per MoE layer on CUDA); scatter_add does not."""
    flat = indices.reshape(-1)
    return torch.zeros(n_experts, dtype=torch.int64, device=flat.device).scatter_add_(
        0, flat, torch.ones_like(flat, dtype=torch.int64)
    )
