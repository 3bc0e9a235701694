"""Grouped SwiGLU expert MLP over expert-sorted tokens (reference: a loop over experts)."""

import torch

from ats_kernels.swiglu import ref_swiglu


def ref_grouped_mlp(
    x_sorted: torch.Tensor,
    tokens_per_expert: torch.Tensor,
    w1: torch.Tensor,
    w3: torch.Tensor,
    w2: torch.Tensor,
) -> torch.Tensor:
    """x_sorted (M, C) grouped by expert, w1/w3 (E, F, C), w2 (E, C, F) -> (M, C).

    Rows of expert e: swiglu(x_e @ w1[e].T, x_e @ w3[e].T) @ w2[e].T.
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
    outs = []
    for e, x_e in enumerate(torch.split(x_sorted, counts)):
        h = ref_swiglu(x_e @ w1[e].T, x_e @ w3[e].T)  # (M_e, F)
        outs.append(h @ w2[e].T)  # (M_e, C)
    if not outs:
        return x_sorted.new_zeros(x_sorted.shape)
    return torch.cat(outs, dim=0)
