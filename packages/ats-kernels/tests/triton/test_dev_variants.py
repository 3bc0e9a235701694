"""Ladder variants not (yet) in src, against their references: dev/rms_norm/04_pipelined (pipelined
backward, Triton dw reduction, residual path included) and dev/rope/03_model_layout (outputs and
input gradients in the model's (B, T, H, hd) memory layout). The ladder's --interpret-smoke checks
bf16 only and no residual; these cover fp32 tight, bf16 loose, odd shapes and layouts."""

import importlib.util
from pathlib import Path

import pytest
import torch
from ats_kernels import ref_rms_norm, ref_rope, rope_tables

DEV = Path(__file__).parents[2] / "dev"


def _variant(op: str, name: str):
    spec = importlib.util.spec_from_file_location(f"dev_{op}_{name}", DEV / op / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def rms04():
    return _variant("rms_norm", "04_pipelined")


@pytest.fixture(scope="module")
def rope03():
    return _variant("rope", "03_model_layout")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_04_matches_reference(device: str, dtype: torch.dtype, close, rms04) -> None:
    g = torch.Generator(device=device).manual_seed(0)
    shapes = [(5, 3, 123), (9, 64)] if device == "cpu" else [(5, 123, 123), (16384, 4096)]
    for shape in shapes:
        x = (torch.randn(shape, generator=g, device=device) * 3).to(dtype).requires_grad_()
        w = (torch.randn(shape[-1], generator=g, device=device) + 1).to(dtype).requires_grad_()
        y = rms04.rms_norm(x, w, 1e-5)
        dy = torch.randn(y.shape, generator=g, device=device).to(dtype)
        dx, dw = torch.autograd.grad(y, (x, w), dy)
        y_ref = ref_rms_norm(x, w, 1e-5)
        dx_ref, dw_ref = torch.autograd.grad(y_ref, (x, w), dy)
        assert dw.dtype == w.dtype  # the Triton dw pass writes the weight dtype
        close(y, y_ref, f"y {shape}")
        close(dx, dx_ref, f"dx {shape}")
        close(dw, dw_ref, f"dw {shape}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_04_residual(device: str, dtype: torch.dtype, close, rms04) -> None:
    g = torch.Generator(device=device).manual_seed(1)
    shape = (3, 5, 123) if device == "cpu" else (8, 2048, 4096)
    x = torch.randn(shape, generator=g, device=device).to(dtype).requires_grad_()
    r = torch.randn(shape, generator=g, device=device).to(dtype).requires_grad_()
    w = (torch.randn(shape[-1], generator=g, device=device) + 1).to(dtype).requires_grad_()
    y, h = rms04.rms_norm_residual(x, r, w, 1e-5)
    dy = torch.randn(shape, generator=g, device=device).to(dtype)
    dh = torch.randn(shape, generator=g, device=device).to(dtype)
    grads = torch.autograd.grad((y, h), (x, r, w), (dy, dh))
    h_ref = x + r
    y_ref = ref_rms_norm(h_ref, w, 1e-5)
    grads_ref = torch.autograd.grad((y_ref, h_ref), (x, r, w), (dy, dh))
    close(h, h_ref, "h")
    close(y, y_ref, "y")
    for what, a, b in zip(("dx", "dr", "dw"), grads, grads_ref, strict=True):
        close(a, b, what)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_03_model_layout(device: str, dtype: torch.dtype, close, rope03) -> None:
    B, T, H, Hk, hd = (2, 7, 4, 2, 16) if device == "cpu" else (4, 1024, 12, 12, 64)
    g = torch.Generator(device=device).manual_seed(2)
    cos, sin = rope_tables(hd, T, device=device)
    q_lin = torch.randn(B, T, H * hd, generator=g, device=device).to(dtype).requires_grad_()
    k_lin = torch.randn(B, T, Hk * hd, generator=g, device=device).to(dtype).requires_grad_()

    def heads(a, b):  # as ats_model's Attention
        return a.view(B, T, H, hd).transpose(1, 2), b.view(B, T, Hk, hd).transpose(1, 2)

    q, k = rope03.rope(*heads(q_lin, k_lin), cos, sin)
    assert q.stride() == heads(q_lin, k_lin)[0].stride()  # the model's layout, not contiguous
    dq = torch.randn(q.shape, generator=g, device=device).to(dtype)
    dk = torch.randn(k.shape, generator=g, device=device).to(dtype)
    grads = torch.autograd.grad((q, k), (q_lin, k_lin), (dq, dk))
    q_ref, k_ref = ref_rope(*heads(q_lin, k_lin), cos, sin)
    grads_ref = torch.autograd.grad((q_ref, k_ref), (q_lin, k_lin), (dq, dk))
    close(q, q_ref, "q")
    close(k, k_ref, "k")
    close(grads[0], grads_ref[0], "dq")
    close(grads[1], grads_ref[1], "dk")
    # contiguous (B, H, T, hd) inputs keep contiguous outputs and gradients
    qc = torch.randn(B, H, T, hd, generator=g, device=device).to(dtype).requires_grad_()
    kc = torch.randn(B, Hk, T, hd, generator=g, device=device).to(dtype).requires_grad_()
    qo, ko = rope03.rope(qc, kc, cos, sin)
    assert qo.is_contiguous() and ko.is_contiguous()
    dqc, dkc = torch.autograd.grad((qo, ko), (qc, kc), (dq, dk))
    qr, kr = ref_rope(qc, kc, cos, sin)
    dqr, dkr = torch.autograd.grad((qr, kr), (qc, kc), (dq, dk))
    close(qo, qr, "q contiguous")
    close(dqc, dqr, "dq contiguous")
    close(dkc, dkr, "dk contiguous")
