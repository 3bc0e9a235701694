"""Grouped SwiGLU expert MLP over expert-sorted tokens (reference: a loop over experts)."""

import torch

from ats_kernels.swiglu import ref_swiglu


def ref_grouped_mlp(
    x_sorted: torch.Tensor,
    tokens_per_expert: torch.Tensor,
    w1: torch.Tensor,
    w3: torch.Tensor,
    w2: torch.Tensor,
    hidden_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """x_sorted (M, C) grouped by expert, w1/w3 (E, F, C), w2 (E, C, F) -> (M, C).

    Rows of expert e: (swiglu(x_e @ w1[e].T, x_e @ w3[e].T) * s_e) @ w2[e].T, where s_e are the
    expert's rows of hidden_scale (M, F): a dropout mask already scaled by 1 / (1 - p); None = 1.
    """
    n_experts = w1.shape[0]
    if tokens_per_expert.numel() != n_experts:
        raise ValueError(
            f"grouped_mlp: tokens_per_expert has {tokens_per_expert.numel()} entries, "
            f"weights have {n_experts} experts"
        )
    counts = tokens_per_expert.tolist()
    if sum(counts) != x_sorted.shape[0]:
        raise ValueError(
            f"grouped_mlp: tokens_per_expert sums to {sum(counts)}, x_sorted has {x_sorted.shape[0]} rows"
        )
    check_hidden_scale(hidden_scale, x_sorted.shape[0], w1.shape[1])
    scales = [None] * n_experts if hidden_scale is None else torch.split(hidden_scale, counts)
    outs = []
    for e, (x_e, s_e) in enumerate(zip(torch.split(x_sorted, counts), scales, strict=True)):
        h = ref_swiglu(x_e @ w1[e].T, x_e @ w3[e].T)  # (M_e, F)
        if s_e is not None:
            h = h * s_e
        outs.append(h @ w2[e].T)  # (M_e, C)
    if not outs:
        return x_sorted.new_zeros(x_sorted.shape)
    return torch.cat(outs, dim=0)


def check_hidden_scale(hidden_scale: torch.Tensor | None, rows: int, hidden: int) -> None:
    if hidden_scale is not None and hidden_scale.shape != (rows, hidden):
        raise ValueError(
            f"grouped_mlp: hidden_scale {tuple(hidden_scale.shape)} must be (M, F) = ({rows}, {hidden})"
        )
