"""RMSNorm (Zhang & Sennrich 2019): reference implementation, HF LlamaRMSNorm order, alone and
after a residual add (the pre-norm block's `norm(x + a)`, which also needs `x + a` itself).

out_dtype: the dtype the result is handed on in. Under autocast every consumer of a norm is a
matmul that casts its input to the autocast dtype first, so a norm that writes that dtype directly
gives the consumer bitwise the same input and saves the fp32 write plus a separate cast pass each
way (the cast's backward likewise)."""

import torch


def ref_rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, out_dtype: torch.dtype | None = None
) -> torch.Tensor:
    """Normalize in fp32 (bf16 sums of squares lose too much), cast back, then scale by weight;
    the product is cast to out_dtype when given (else it keeps torch's promoted dtype)."""
    xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    y = normed.to(x.dtype) * weight
    return y if out_dtype is None else y.to(out_dtype)


def ref_rms_norm_residual(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    out_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """h = x + residual; returns (ref_rms_norm(h, weight, eps, out_dtype), h). residual may be of
    a lower precision than x (bf16 sublayer output onto an fp32 residual stream under autocast)."""
    h = x + residual
    return ref_rms_norm(h, weight, eps, out_dtype), h
