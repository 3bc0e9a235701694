"""Triton cross_entropy and fused linear_cross_entropy against the references, ignore_index included."""

import math

import pytest
import torch
from ats_kernels import ref_cross_entropy, ref_linear_cross_entropy


def _targets(n: int, vocab: int, g: torch.Generator, device: str) -> torch.Tensor:
    t = torch.randint(0, vocab, (n,), generator=g, device=device)
    t[::5] = -100  # every fifth token ignored
    return t


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cross_entropy_matches_reference(device: str, dtype: torch.dtype, close) -> None:
    from ats_kernels.triton import cross_entropy

    g = torch.Generator(device=device).manual_seed(0)
    shapes = [(37, 5000)] if device == "cpu" else [(37, 5000), (4096, 128256)]
    for N, V in shapes:
        big = (torch.randn(N, V + 3, generator=g, device=device) * 4).to(dtype)
        logits = big[:, :V].requires_grad_()  # row stride V + 3
        t = _targets(N, V, g, device)
        loss = cross_entropy(logits, t)
        loss_ref = ref_cross_entropy(logits, t)
        close(loss, loss_ref, f"loss {N}x{V}", tol=1e-5)
        grad = torch.autograd.grad(loss * 3, logits)[0]
        grad_ref = torch.autograd.grad(loss_ref * 3, logits)[0]
        close(grad, grad_ref, f"grad {N}x{V}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear_cross_entropy_matches_reference(device: str, dtype: torch.dtype, close) -> None:
    from ats_kernels.triton import linear_cross_entropy

    g = torch.Generator(device=device).manual_seed(1)
    cases = (
        [(37, 24, 3000, 16), (37, 24, 3000, None)]
        if device == "cpu"
        else [(8192, 4096, 32000, None)]
    )
    for N, C, V, chunk in cases:
        h = torch.randn(N, C, generator=g, device=device).to(dtype).requires_grad_()
        w = (
            (torch.randn(V, C, generator=g, device=device) / math.sqrt(C))
            .to(dtype)
            .requires_grad_()
        )
        t = _targets(N, V, g, device)
        loss = linear_cross_entropy(h, w, t, chunk_size=chunk)
        loss_ref = ref_linear_cross_entropy(h, w, t)
        close(
            loss,
            loss_ref,
            f"loss N={N} chunk={chunk}",
            tol=1e-4 if dtype == torch.float32 else 2e-3,
        )
        gh, gw = torch.autograd.grad(loss * 0.5, (h, w))
        gh_ref, gw_ref = torch.autograd.grad(loss_ref * 0.5, (h, w))
        close(gh, gh_ref, f"grad h chunk={chunk}")
        close(gw, gw_ref, f"grad w chunk={chunk}")


def test_linear_cross_entropy_without_grad_and_all_ignored(device: str) -> None:
    from ats_kernels.triton import linear_cross_entropy

    torch.manual_seed(0)
    h, w = torch.randn(9, 8, device=device), torch.randn(50, 8, device=device)
    t = torch.randint(0, 50, (9,), device=device)
    with torch.no_grad():
        torch.testing.assert_close(linear_cross_entropy(h, w, t), ref_linear_cross_entropy(h, w, t))
    assert math.isnan(float(linear_cross_entropy(h, w, torch.full_like(t, -100))))


def test_cross_entropy_rejects_bad_targets(device: str, expect_input_error) -> None:
    from ats_kernels.triton import cross_entropy, linear_cross_entropy

    logits = torch.randn(3, 10, device=device)
    if device == "cpu":  # the CPU check names the first bad target
        with pytest.raises(ValueError, match="target 10 is outside"):
            cross_entropy(logits, torch.tensor([1, 10, 2], device=device))
    expect_input_error(
        device,
        "target .*is outside \\[0, 10\\)",
        "from ats_kernels.triton import cross_entropy\n"
        "cross_entropy(torch.randn(3, 10, device=device), torch.tensor([1, 10, 2], device=device))",
    )
    with pytest.raises(ValueError, match="must be \\(N, C\\), \\(V, C\\)"):
        linear_cross_entropy(
            logits,
            torch.randn(5, 9, device=device),
            torch.zeros(3, dtype=torch.long, device=device),
        )
