"""RMSNorm (Zhang & Sennrich 2019): reference implementation, HF LlamaRMSNorm order, alone and
after a residual add (the pre-norm block's `norm(x + a)`, which also needs `x + a` itself)."""

import torch


def ref_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Normalize in fp32 (bf16 sums of squares lose too much), cast back, then scale by weight."""
    xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return normed.to(x.dtype) * weight


def ref_rms_norm_residual(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """h = x + residual; returns (ref_rms_norm(h, weight, eps), h). residual may be of a lower
    precision than x (bf16 sublayer output onto an fp32 residual stream under autocast)."""
    h = x + residual
    return ref_rms_norm(h, weight, eps), h
