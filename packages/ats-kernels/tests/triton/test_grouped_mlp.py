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


@pytest.mark.parametrize("dropout", [0.0, 0.3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("gemm", ["torch", "triton"])
def test_grouped_mlp_matches_reference(
    device: str, dtype: torch.dtype, gemm: str, dropout: float, close
) -> None:
    """dropout > 0: the same scaled mask on the hidden activations (ModelConfig.ffn_dropout)."""
    from ats_kernels.triton import grouped_mlp

    if gemm == "torch" and not hasattr(torch, "_grouped_mm"):
        pytest.skip(f"torch {torch.__version__} has no _grouped_mm")
    if gemm == "torch" and device == "cuda" and dtype != torch.bfloat16:
        pytest.skip("torch._grouped_mm's CUDA kernel is bf16-only")
    g = torch.Generator(device=device).manual_seed(0)
    counts, (x, w1, w3, w2) = _case(device, g, dtype)
    scale = None
    if dropout:
        keep = torch.rand(x.shape[0], w1.shape[1], generator=g, device=device) >= dropout
        scale = (keep / (1 - dropout)).to(dtype)
    y = grouped_mlp(x, counts, w1, w3, w2, hidden_scale=scale, gemm=gemm)
    y_ref = ref_grouped_mlp(x, counts, w1, w3, w2, hidden_scale=scale)
    tol = 1e-4 if dtype == torch.float32 else None
    close(y, y_ref, "y", tol=tol)
    dy = torch.randn(y.shape, generator=g, device=device).to(dtype)
    grads = torch.autograd.grad(y, (x, w1, w3, w2), dy)
    grads_ref = torch.autograd.grad(y_ref, (x, w1, w3, w2), dy)
    for name, a, b in zip(("dx", "dw1", "dw3", "dw2"), grads, grads_ref, strict=True):
        close(a, b, name, tol=tol)


def test_grouped_mlp_rejects_bad_counts(device: str, expect_input_error) -> None:
    from ats_kernels.triton import grouped_mlp

    w = torch.randn(2, 8, 16, device=device)
    expect_input_error(
        device,
        "tokens_per_expert does not sum to x_sorted's 6 rows",
        "from ats_kernels.triton import grouped_mlp\n"
        "w = torch.randn(2, 8, 16, device=device)\n"
        "grouped_mlp(torch.randn(6, 16, device=device), torch.tensor([2, 3], device=device),"
        " w, w, w.transpose(1, 2))",
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


def test_grouped_mlp_under_autocast_matches_reference(device: str, close) -> None:
    """fp32 master weights under bf16 autocast: GEMMs in bf16 like the reference's matmuls, bf16
    output, fp32 weight gradients (the bug this guards: fp32 IEEE GEMMs in bf16 training)."""
    from ats_kernels.triton import grouped_mlp

    g = torch.Generator(device=device).manual_seed(3)
    counts, params = _case(device, g, torch.float32)
    x, w1, w3, w2 = params
    with torch.autocast(device, dtype=torch.bfloat16):
        y = grouped_mlp(x, counts, w1, w3, w2)
        y_ref = ref_grouped_mlp(x, counts, w1, w3, w2)
    assert y.dtype == y_ref.dtype == torch.bfloat16
    close(y, y_ref, "y")
    dy = torch.randn(y.shape, generator=g, device=device).to(y.dtype)
    grads = torch.autograd.grad(y, params, dy)
    grads_ref = torch.autograd.grad(y_ref, params, dy)
    for name, a, b in zip(("dx", "dw1", "dw3", "dw2"), grads, grads_ref, strict=True):
        assert a.dtype == torch.float32, name
        close(a, b, name, tol=2e-2)
