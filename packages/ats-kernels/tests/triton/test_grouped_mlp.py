"""Triton-side grouped_mlp (torch._grouped_mm and the Triton grouped GEMM) against ref_grouped_mlp."""

import pytest
import torch
from ats_kernels import ref_grouped_mlp


def _case(device: str, g: torch.Generator, dtype: torch.dtype):
    if device == "cpu":
        E, C, F = 4, 40, 24
        counts = torch.tensor([5, 0, 70, 3], device=device)  # one empty expert, odd sizes
    else:
        E, C, F = 8, 1024, 2816
        counts = torch.randint(0, 4096, (E,), generator=g, device=device)
        counts[3] = 0
    M = int(counts.sum())
    x = torch.randn(M, C, generator=g, device=device).to(dtype)
    w1 = (torch.randn(E, F, C, generator=g, device=device) * C**-0.5).to(dtype)
    w3 = (torch.randn(E, F, C, generator=g, device=device) * C**-0.5).to(dtype)
    w2 = (torch.randn(E, C, F, generator=g, device=device) * F**-0.5).to(dtype)
    return counts, [t.requires_grad_() for t in (x, w1, w3, w2)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("gemm", ["torch", "triton"])
def test_grouped_mlp_matches_reference(device: str, dtype: torch.dtype, gemm: str, close) -> None:
    from ats_kernels.triton import grouped_mlp

    if gemm == "torch" and not hasattr(torch, "_grouped_mm"):
        pytest.skip(f"torch {torch.__version__} has no _grouped_mm")
    if gemm == "torch" and device == "cuda" and dtype != torch.bfloat16:
        pytest.skip("torch._grouped_mm's CUDA kernel is bf16-only")
    g = torch.Generator(device=device).manual_seed(0)
    counts, (x, w1, w3, w2) = _case(device, g, dtype)
    y = grouped_mlp(x, counts, w1, w3, w2, gemm=gemm)
    y_ref = ref_grouped_mlp(x, counts, w1, w3, w2)
    tol = 1e-4 if dtype == torch.float32 else None
    close(y, y_ref, "y", tol=tol)
    dy = torch.randn(y.shape, generator=g, device=device).to(dtype)
    grads = torch.autograd.grad(y, (x, w1, w3, w2), dy)
    grads_ref = torch.autograd.grad(y_ref, (x, w1, w3, w2), dy)
    for name, a, b in zip(("dx", "dw1", "dw3", "dw2"), grads, grads_ref, strict=True):
        close(a, b, name, tol=tol)


def test_grouped_mlp_rejects_bad_counts(device: str) -> None:
    from ats_kernels.triton import grouped_mlp

    w = torch.randn(2, 8, 16, device=device)
    with pytest.raises(ValueError, match="sums to 5, x_sorted has 6 rows"):
        grouped_mlp(
            torch.randn(6, 16, device=device),
            torch.tensor([2, 3], device=device),
            w,
            w,
            w.transpose(1, 2),
        )
    with pytest.raises(ValueError, match="gemm = 'cuda'"):
        grouped_mlp(
            torch.randn(5, 16, device=device),
            torch.tensor([2, 3], device=device),
            w,
            w,
            w.transpose(1, 2),
            gemm="cuda",
        )
