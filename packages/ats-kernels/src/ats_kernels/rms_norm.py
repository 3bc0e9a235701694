"""RMSNorm (Zhang & Sennrich 2019): reference implementation, HF LlamaRMSNorm order."""

import torch


def ref_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Normalize in fp32 (bf16 sums of squares lose too much), cast back, then scale by weight."""
    xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return normed.to(x.dtype) * weight
