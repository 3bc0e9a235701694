"""Triton moe_route against ref_moe_route: choice, weights, probs, per-expert counts, gradients."""

import pytest
import torch
from ats_kernels import ref_moe_route


def _tie_free_logits(
    N: int, E: int, g: torch.Generator, device: str, dtype: torch.dtype
) -> torch.Tensor:
    """Distinct values per row even in bf16, so top-k has one answer (ties may order differently)."""
    ranks = torch.argsort(torch.rand(N, E, generator=g, device=device), dim=-1).float()
    return (ranks * (4.0 / E)).to(dtype)


CASES = [  # (E, top_k, temperature, bias, norm_topk)
    (8, 2, 1.0, False, True),
    (6, 3, 0.7, True, False),
    (64, 8, 1.3, True, True),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"E{c[0]}k{c[1]}")
def test_moe_route_matches_reference(device: str, dtype: torch.dtype, case, close) -> None:
    from ats_kernels.triton import moe_route

    E, k, temperature, use_bias, norm = case
    g = torch.Generator(device=device).manual_seed(0)
    N = 37 if device == "cpu" else 16384
    logits = _tie_free_logits(N, E, g, device, dtype).requires_grad_()
    # a 0/1 bias: biased experts always win (probs < 1), so choices move but no near-tie can arise
    bias = (torch.rand(E, generator=g, device=device) < 0.5).float() if use_bias else None
    w, idx, probs, counts = moe_route(logits, k, temperature, bias, norm)
    w_ref, idx_ref, probs_ref, counts_ref = ref_moe_route(logits, k, temperature, bias, norm)
    assert torch.equal(idx, idx_ref)
    assert torch.equal(counts, counts_ref)
    assert torch.equal(counts, torch.bincount(idx_ref.reshape(-1), minlength=E))
    assert w.dtype == dtype and probs.dtype == torch.float32
    close(w, w_ref, "weights")
    close(probs, probs_ref, "probs", tol=1e-5)
    dw = torch.randn(w.shape, generator=g, device=device).to(dtype)
    dp = torch.randn(probs.shape, generator=g, device=device)
    grad = torch.autograd.grad((w, probs), logits, (dw, dp))[0]
    grad_ref = torch.autograd.grad((w_ref, probs_ref), logits, (dw, dp))[0]
    close(grad, grad_ref, "d logits")


def test_moe_route_rejects_bad_arguments(device: str) -> None:
    from ats_kernels.triton import moe_route

    logits = torch.randn(4, 8, device=device)
    with pytest.raises(ValueError, match="top_k = 9"):
        moe_route(logits, 9)
    with pytest.raises(ValueError, match="temperature = 0"):
        moe_route(logits, 2, temperature=0)
