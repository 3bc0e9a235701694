"""Grouped SwiGLU expert MLP, forward + backward, on grouped GEMMs (torch._grouped_mm or Triton).

Forward per expert e, with w13[e] = [w1[e]; w3[e]] (F + F rows, one GEMM for gate and up):
  ab = x_e @ w13[e].T,  a, b = ab[:, :F], ab[:, F:],  h = silu(a) * b,  y = h @ w2[e].T.
Backward saves x, w13, w2 and ab (h is recomputed by the SwiGLU kernel) and issues four grouped
GEMMs: dh = dy @ w2[e]; d_ab = swiglu'(dh) (both halves into one buffer); dx = d_ab @ w13[e] (one
GEMM over K = 2F instead of two and an add); dw13 = d_ab.T @ x, dw2 = dy.T @ h.
With hidden_scale s (a scaled dropout mask), h = silu(a) * b * s, and dh is multiplied by s before
swiglu'.
"""

import torch

from ats_kernels.grouped_mlp import check_hidden_scale
from ats_kernels.triton.grouped_gemm import gmm, gmm_wgrad, torch_grouped_mm_usable
from ats_kernels.triton.launch import check_on_device
from ats_kernels.triton.swiglu import swiglu_backward, swiglu_forward

GEMMS = ("torch", "triton")


class _GroupedMLP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, offs, w1, w3, w2, use_torch: bool, scale):
        F = w1.shape[1]
        w13 = torch.cat([w1, w3], dim=1)  # (E, 2F, C)
        ab = gmm(x, w13.transpose(1, 2), offs, use_torch)  # (M, 2F)
        h = swiglu_forward(ab[:, :F], ab[:, F:])  # (M, F)
        if scale is not None:
            h = h.mul_(scale)
        y = gmm(h, w2.transpose(1, 2), offs, use_torch)  # (M, C)
        ctx.save_for_backward(x, offs, w13, w2, ab, scale)
        ctx.use_torch = use_torch
        return y

    @staticmethod
    def backward(ctx, dy):
        x, offs, w13, w2, ab, scale = ctx.saved_tensors
        use_torch = ctx.use_torch
        F = w2.shape[2]
        a, b = ab[:, :F], ab[:, F:]
        dy = dy.contiguous()
        dh = gmm(dy, w2, offs, use_torch)  # (M, F)
        h = swiglu_forward(a, b)  # (M, F)
        if scale is not None:
            dh, h = dh.mul_(scale), h.mul_(scale)
        d_ab = torch.empty_like(ab)  # (M, 2F)
        swiglu_backward(dh, a, b, out=d_ab)
        dx = gmm(d_ab, w13, offs, use_torch)  # (M, C)
        dw13 = gmm_wgrad(d_ab, x, offs, use_torch)  # (E, 2F, C)
        dw2 = gmm_wgrad(dy, h, offs, use_torch)  # (E, C, F)
        return dx, None, dw13[:, :F], dw13[:, F:], dw2, None, None


def grouped_mlp(
    x_sorted: torch.Tensor,
    tokens_per_expert: torch.Tensor,
    w1: torch.Tensor,
    w3: torch.Tensor,
    w2: torch.Tensor,
    hidden_scale: torch.Tensor | None = None,
    gemm: str | None = None,
) -> torch.Tensor:
    """Same result as ref_grouped_mlp: x_sorted (M, C), w1/w3 (E, F, C), w2 (E, C, F) -> (M, C);
    hidden_scale (M, F) multiplies the hidden activations (a scaled dropout mask) or is None.

    gemm: "torch" (torch._grouped_mm), "triton", or None = torch._grouped_mm where it has its fast
    path (CUDA sm_90+, bf16), else Triton.
    """
    E, F, C = w1.shape
    if (
        w3.shape != (E, F, C)
        or w2.shape != (E, C, F)
        or x_sorted.dim() != 2
        or x_sorted.shape[1] != C
    ):
        raise ValueError(
            f"grouped_mlp: x_sorted {tuple(x_sorted.shape)}, w1 {tuple(w1.shape)}, w3 {tuple(w3.shape)}, "
            f"w2 {tuple(w2.shape)} must be (M, C), (E, F, C), (E, F, C), (E, C, F)"
        )
    if torch.is_autocast_enabled(x_sorted.device.type):
        # What the reference's matmuls do under autocast: GEMMs in the autocast dtype (bf16 tensor
        # cores), gradients flowing back to the fp32 master weights through the cast.
        dtype = torch.get_autocast_dtype(x_sorted.device.type)
        x_sorted, w1, w3, w2 = (t.to(dtype) for t in (x_sorted, w1, w3, w2))
    if not (x_sorted.dtype == w1.dtype == w3.dtype == w2.dtype):
        raise ValueError(
            f"grouped_mlp: x_sorted {x_sorted.dtype} and weights {w1.dtype} must share a dtype"
        )
    if tokens_per_expert.numel() != E:
        raise ValueError(
            f"grouped_mlp: tokens_per_expert has {tokens_per_expert.numel()} entries, weights have {E} experts"
        )
    check_hidden_scale(hidden_scale, x_sorted.shape[0], F)
    if hidden_scale is not None:
        hidden_scale = hidden_scale.to(x_sorted.dtype).contiguous()
    offs = torch.cumsum(tokens_per_expert, 0).to(torch.int32)  # (E,) cumulative row ends
    if E > 0:
        check_on_device(
            offs[-1] == x_sorted.shape[0],
            f"grouped_mlp: tokens_per_expert does not sum to x_sorted's {x_sorted.shape[0]} rows",
        )
    elif x_sorted.shape[0]:
        raise ValueError(f"grouped_mlp: no experts for x_sorted's {x_sorted.shape[0]} rows")
    if gemm is None:
        use_torch = torch_grouped_mm_usable(x_sorted)
    elif gemm in GEMMS:
        use_torch = gemm == "torch"
        if use_torch and not hasattr(torch, "_grouped_mm"):
            raise RuntimeError(
                f"grouped_mlp: gemm='torch' but torch {torch.__version__} has no _grouped_mm"
            )
    else:
        raise ValueError(f"grouped_mlp: gemm = {gemm!r}; expected one of {GEMMS} or None")
    return _GroupedMLP.apply(x_sorted.contiguous(), offs, w1, w3, w2, use_torch, hidden_scale)
