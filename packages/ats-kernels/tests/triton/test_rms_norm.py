"""Triton rms_norm / rms_norm_residual against ref_rms_norm: forward, dx and dw."""

import pytest
import torch
from ats_kernels import ref_rms_norm

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _shapes(device: str) -> list[tuple[int, ...]]:
    if device == "cpu":
        return [(5, 3, 123), (2, 64)]
    return [(5, 123, 123), (16384, 4096), (3, 1000, 8192)]


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_matches_reference(device: str, dtype: torch.dtype, close) -> None:
    from ats_kernels.triton import rms_norm

    g = torch.Generator(device=device).manual_seed(0)
    for shape in _shapes(device):
        x = (torch.randn(shape, generator=g, device=device) * 3).to(dtype).requires_grad_()
        w = (torch.randn(shape[-1], generator=g, device=device) + 1).to(dtype).requires_grad_()
        y = rms_norm(x, w, 1e-5)
        dy = torch.randn(y.shape, generator=g, device=device).to(dtype)
        dx, dw = torch.autograd.grad(y, (x, w), dy)
        y_ref = ref_rms_norm(x, w, 1e-5)
        dx_ref, dw_ref = torch.autograd.grad(y_ref, (x, w), dy)
        assert y.dtype == y_ref.dtype and y.shape == y_ref.shape
        close(y, y_ref, f"y {shape}")
        close(dx, dx_ref, f"dx {shape}")
        close(dw, dw_ref, f"dw {shape}")


def test_rms_norm_non_contiguous_and_fp32_weight(device: str, close) -> None:
    from ats_kernels.triton import rms_norm

    torch.manual_seed(0)
    base = torch.randn(7, 96, 5, device=device, dtype=torch.bfloat16)
    x = base.transpose(1, 2).requires_grad_()  # (7, 5, 96), unit stride broken
    w = torch.randn(96, device=device, requires_grad=True)  # fp32 weight: output promotes to fp32
    y = rms_norm(x, w, 1e-6)
    y_ref = ref_rms_norm(x, w, 1e-6)
    assert y.dtype == torch.float32
    close(y, y_ref, "y", tol=2e-2)
    dy = torch.randn_like(y_ref)
    dx, dw = torch.autograd.grad(y, (x, w), dy)
    dx_ref, dw_ref = torch.autograd.grad(y_ref, (x, w), dy)
    close(dx, dx_ref, "dx", tol=2e-2)
    close(dw, dw_ref, "dw", tol=2e-2)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_residual_matches_add_then_norm(device: str, dtype: torch.dtype, close) -> None:
    from ats_kernels.triton import rms_norm_residual

    g = torch.Generator(device=device).manual_seed(1)
    shape = (3, 5, 123) if device == "cpu" else (8, 2048, 4096)
    x = torch.randn(shape, generator=g, device=device).to(dtype).requires_grad_()
    r = torch.randn(shape, generator=g, device=device).to(dtype).requires_grad_()
    w = torch.randn(shape[-1], generator=g, device=device).to(dtype).requires_grad_()
    y, h = rms_norm_residual(x, r, w, 1e-5)
    h_ref = x + r
    y_ref = ref_rms_norm(h_ref, w, 1e-5)
    close(h, h_ref, "h")
    close(y, y_ref, "y")
    dy, dh = torch.randn_like(y), torch.randn_like(h)
    grads = torch.autograd.grad((y, h), (x, r, w), (dy, dh))
    grads_ref = torch.autograd.grad((y_ref, h_ref), (x, r, w), (dy, dh))
    for name, a, b in zip(("dx", "dresidual", "dw"), grads, grads_ref, strict=True):
        close(a, b, name)


def test_rms_norm_rejects_bad_input(device: str) -> None:
    from ats_kernels.triton import rms_norm, rms_norm_residual

    x = torch.randn(2, 8, device=device)
    with pytest.raises(ValueError, match=r"weight shape \(7,\)"):
        rms_norm(x, torch.ones(7, device=device), 1e-5)
    with pytest.raises(TypeError, match="float64"):
        rms_norm(x.double(), torch.ones(8, device=device), 1e-5)
    with pytest.raises(ValueError, match="promotes to x's torch.bfloat16"):
        # bf16 stream + fp32 residual: torch's x + residual would be fp32, h could not hold it
        rms_norm_residual(x.bfloat16(), x, torch.ones(8, device=device), 1e-5)
    with pytest.raises(ValueError, match=r"x's shape \(2, 8\)"):
        rms_norm_residual(x, x[:, :4], torch.ones(8, device=device), 1e-5)


def test_rms_norm_residual_bf16_residual_onto_fp32_stream(device: str, close) -> None:
    """Under autocast the residual stream is fp32 (the embedding's output) and each sublayer's
    output bf16: h = x + a promotes to fp32, and a's gradient comes back in bf16."""
    from ats_kernels import ref_rms_norm_residual
    from ats_kernels.triton import rms_norm_residual

    g = torch.Generator(device=device).manual_seed(2)
    shape = (2, 7, 96) if device == "cpu" else (8, 1024, 768)
    x = torch.randn(shape, generator=g, device=device).requires_grad_()
    a = torch.randn(shape, generator=g, device=device).bfloat16().requires_grad_()
    w = (torch.randn(shape[-1], generator=g, device=device) + 1).requires_grad_()
    y, h = rms_norm_residual(x, a, w, 1e-5)
    y_ref, h_ref = ref_rms_norm_residual(x, a, w, 1e-5)
    assert h.dtype == h_ref.dtype == torch.float32 and y.dtype == y_ref.dtype == torch.float32
    torch.testing.assert_close(h, h_ref, rtol=0, atol=0)  # one fp32 add, the same on both sides
    close(y, y_ref, "y")
    dy, dh = torch.randn_like(y), torch.randn_like(h)
    grads = torch.autograd.grad((y, h), (x, a, w), (dy, dh))
    grads_ref = torch.autograd.grad((y_ref, h_ref), (x, a, w), (dy, dh))
    assert grads[1].dtype == torch.bfloat16
    for name, got, want in zip(("dx", "da", "dw"), grads, grads_ref, strict=True):
        close(got, want, name)


@pytest.mark.parametrize("residual", [False, True])
def test_out_dtype_is_the_reference_cast_to_it(device: str, residual: bool, close) -> None:
    """An fp32 stream written straight as bf16 (what autocast's next matmul would cast it to):
    the reference's fp32 result cast to bf16 (bitwise but for a few rounding-boundary elements,
    whose fp32 statistics differ in the last bit), and the same gradients."""
    from ats_kernels import ref_rms_norm_residual
    from ats_kernels.triton import rms_norm, rms_norm_residual

    g = torch.Generator(device=device).manual_seed(3)
    shape = (2, 7, 96) if device == "cpu" else (8, 1024, 768)
    x = torch.randn(shape, generator=g, device=device).requires_grad_()
    a = torch.randn(shape, generator=g, device=device).bfloat16().requires_grad_()
    w = (torch.randn(shape[-1], generator=g, device=device) + 1).requires_grad_()
    if residual:
        y, h = rms_norm_residual(x, a, w, 1e-5, torch.bfloat16)
        y_fp32, h_ref = ref_rms_norm_residual(x, a, w, 1e-5)
        outs, outs_ref, inputs = (y, h), (y_fp32.bfloat16(), h_ref), (x, a, w)
    else:
        y = rms_norm(x, w, 1e-5, torch.bfloat16)
        y_fp32 = ref_rms_norm(x, w, 1e-5)
        outs, outs_ref, inputs = (y,), (y_fp32.bfloat16(),), (x, w)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y, outs_ref[0], rtol=0, atol=2**-7 * y_fp32.abs().max().item())
    if device == "cuda":  # Triton's CPU interpreter truncates fp32 -> bf16 instead of rounding
        exact = (y == outs_ref[0]).float().mean().item()
        assert exact > 0.999, f"only {exact:.4f} of the bf16 outputs equal the cast reference"
    cotangents = [torch.randn(o.shape, generator=g, device=device).to(o.dtype) for o in outs]
    grads = torch.autograd.grad(outs, inputs, cotangents)
    grads_ref = torch.autograd.grad(outs_ref, inputs, cotangents)
    for i, (got, want) in enumerate(zip(grads, grads_ref, strict=True)):
        assert got.dtype == want.dtype
        close(got, want, f"grad {i}")


def test_out_dtype_rejects_float64(device: str) -> None:
    from ats_kernels.triton import rms_norm

    x = torch.randn(2, 8, device=device)
    with pytest.raises(TypeError, match="out_dtype = torch.float64"):
        rms_norm(x, torch.ones(8, device=device), 1e-5, torch.float64)
