"""Triton swiglu against ref_swiglu, including the two row-strided halves of a fused projection."""

import pytest
import torch
from ats_kernels import ref_swiglu


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_swiglu_matches_reference(device: str, dtype: torch.dtype, close) -> None:
    from ats_kernels.triton import swiglu

    g = torch.Generator(device=device).manual_seed(0)
    shapes = [(5, 13, 123)] if device == "cpu" else [(5, 123, 123), (16384, 4096), (4, 1024, 11008)]
    for shape in shapes:
        gate = (torch.randn(shape, generator=g, device=device) * 3).to(dtype).requires_grad_()
        up = torch.randn(shape, generator=g, device=device).to(dtype).requires_grad_()
        y = swiglu(gate, up)
        dy = torch.randn(y.shape, generator=g, device=device).to(dtype)
        grads = torch.autograd.grad(y, (gate, up), dy)
        y_ref = ref_swiglu(gate, up)
        grads_ref = torch.autograd.grad(y_ref, (gate, up), dy)
        close(y, y_ref, f"y {shape}")
        close(grads[0], grads_ref[0], f"dgate {shape}")
        close(grads[1], grads_ref[1], f"dup {shape}")


def test_swiglu_strided_halves(device: str, close) -> None:
    from ats_kernels.triton import swiglu

    torch.manual_seed(0)
    fused = torch.randn(3, 7, 2 * 150, device=device, requires_grad=True)
    gate, up = fused.chunk(2, dim=-1)  # (3, 7, 150) views with row stride 300
    y = swiglu(gate, up)
    y_ref = ref_swiglu(gate, up)
    close(y, y_ref, "y")
    dy = torch.randn_like(y_ref)
    close(torch.autograd.grad(y, fused, dy)[0], torch.autograd.grad(y_ref, fused, dy)[0], "dfused")


def test_swiglu_rejects_mismatch(device: str) -> None:
    from ats_kernels.triton import swiglu

    with pytest.raises(ValueError, match="must match"):
        swiglu(torch.randn(2, 3, device=device), torch.randn(2, 4, device=device))


def test_swiglu_backward_into_one_fused_gradient(device: str, close) -> None:
    """out=: d gate and d up written into the two halves of one (M, 2N) buffer, the gradient of a
    fused gate|up projection, equal to the separate ones."""
    from ats_kernels.triton.swiglu import swiglu_backward

    torch.manual_seed(0)
    fused = torch.randn(21, 2 * 150, device=device)
    gate, up = fused[:, :150], fused[:, 150:]
    dy = torch.randn(21, 150, device=device)
    out = torch.full_like(fused, float("nan"))
    dg, du = swiglu_backward(dy, gate, up, out=out)
    want_g, want_u = swiglu_backward(dy, gate, up)
    assert dg.data_ptr() == out.data_ptr() and du.data_ptr() == out[:, 150:].data_ptr()
    close(out, torch.cat([want_g, want_u], dim=1), "fused gradient")
    with pytest.raises(ValueError, match=r"out \(21, 299\) must be \(21, 300\)"):
        swiglu_backward(dy, gate, up, out=out[:, :299])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_swiglu_packed_matches_reference(device: str, dtype: torch.dtype, close) -> None:
    """One (..., 2N) gate|up input, as a fused projection gives it; its gradient is one tensor."""
    from ats_kernels import ref_swiglu_packed
    from ats_kernels.triton import swiglu_packed

    g = torch.Generator(device=device).manual_seed(0)
    shapes = [(5, 13, 246)] if device == "cpu" else [(5, 123, 246), (4, 1024, 4096)]
    for shape in shapes:
        gate_up = (torch.randn(shape, generator=g, device=device) * 3).to(dtype).requires_grad_()
        y = swiglu_packed(gate_up)
        dy = torch.randn(y.shape, generator=g, device=device).to(dtype)
        (grad,) = torch.autograd.grad(y, gate_up, dy)
        y_ref = ref_swiglu_packed(gate_up)
        (grad_ref,) = torch.autograd.grad(y_ref, gate_up, dy)
        close(y, y_ref, f"y {shape}")
        close(grad, grad_ref, f"dgate_up {shape}")
    with pytest.raises(ValueError, match="last dim 5 of gate_up must be even"):
        swiglu_packed(torch.randn(2, 5, device=device))
