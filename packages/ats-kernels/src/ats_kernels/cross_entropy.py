"""Cross-entropy over a vocabulary, and the same loss fused with the LM head (reference).

Both return the mean over targets != ignore_index, computed in fp32 (NaN when every target is
ignored, as torch.nn.functional.cross_entropy does).
"""

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


def ref_cross_entropy(
    logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100
) -> torch.Tensor:
    """logits (N, V), targets (N,) -> scalar mean loss."""
    compute = logits if logits.dtype == torch.float64 else logits.float()
    return F.cross_entropy(compute, targets, ignore_index=ignore_index)


def _chunk_loss_sum(
    h: torch.Tensor, w: torch.Tensor, t: torch.Tensor, ignore_index: int
) -> torch.Tensor:
    logits = h @ w.T  # (n, V)
    compute = logits if logits.dtype == torch.float64 else logits.float()
    return F.cross_entropy(compute, t, ignore_index=ignore_index, reduction="sum")


def ref_linear_cross_entropy(
    h: torch.Tensor,
    w: torch.Tensor,
    targets: torch.Tensor,
    ignore_index: int = -100,
    chunk_size: int = 4096,
) -> torch.Tensor:
    """h (N, C), w (V, C), targets (N,) -> ref_cross_entropy(h @ w.T, targets).

    Chunked over N with activation checkpointing per chunk, so at most one (chunk_size, V) block
    of logits is alive at a time in forward and backward. One chunk that holds every row is the
    plain unfused path (checkpointing it would only add a second head matmul).
    """
    if chunk_size < 1:
        raise ValueError(f"ref_linear_cross_entropy: chunk_size = {chunk_size} must be >= 1")
    if chunk_size >= h.shape[0]:
        return ref_cross_entropy(h @ w.T, targets, ignore_index)
    total = h.new_zeros((), dtype=torch.float64 if h.dtype == torch.float64 else torch.float32)
    for start in range(0, h.shape[0], chunk_size):
        sl = slice(start, start + chunk_size)
        total = total + checkpoint(
            _chunk_loss_sum, h[sl], w, targets[sl], ignore_index, use_reentrant=False
        )
    count = (targets != ignore_index).sum()
    return total / count
