"""Triton rope against ref_rope: shared and per-position tables, GQA, transposed q/k views."""

import pytest
import torch
from ats_kernels import ref_rope, rope_tables


def _case(device: str):
    if device == "cpu":
        return [(2, 4, 2, 5, 16), (1, 3, 1, 7, 10)]  # (B, n_head, n_kv_head, T, hd)
    return [(2, 32, 8, 2048, 128), (5, 12, 4, 123, 64), (4, 32, 32, 4096, 128)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("per_position", [False, True])
def test_rope_matches_reference(device: str, dtype: torch.dtype, per_position: bool, close) -> None:
    from ats_kernels.triton import rope

    g = torch.Generator(device=device).manual_seed(0)
    for B, H, Hk, T, hd in _case(device):
        cos, sin = rope_tables(hd, 2 * T, theta=10000.0, device=device)
        if per_position:  # (B, T, hd): e.g. left-padded batches with their own positions
            pos = torch.randint(0, 2 * T, (B, T), generator=g, device=device)
            cos, sin = cos[pos], sin[pos]
        else:
            cos, sin = cos[:T], sin[:T]
        # q as the transpose of a (B, T, H, hd) projection, as attention layers produce it
        q = torch.randn(B, T, H, hd, generator=g, device=device).to(dtype).transpose(1, 2)
        k = torch.randn(B, Hk, T, hd, generator=g, device=device).to(dtype)
        q.requires_grad_()
        k.requires_grad_()
        qo, ko = rope(q, k, cos, sin)
        qr, kr = ref_rope(q, k, cos, sin)
        close(qo, qr, "q")
        close(ko, kr, "k")
        dq = torch.randn(qo.shape, generator=g, device=device).to(dtype)
        dk = torch.randn(ko.shape, generator=g, device=device).to(dtype)
        grads = torch.autograd.grad((qo, ko), (q, k), (dq, dk))
        grads_ref = torch.autograd.grad((qr, kr), (q, k), (dq, dk))
        close(grads[0], grads_ref[0], "dq")
        close(grads[1], grads_ref[1], "dk")


def test_rope_rejects_bad_tables(device: str) -> None:
    from ats_kernels.triton import rope

    q = torch.randn(1, 2, 4, 8, device=device)
    cos, sin = rope_tables(8, 3, device=device)
    with pytest.raises(ValueError, match="must be \\(T, hd\\)"):
        rope(q, q, cos, sin)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("per_position", [False, True])
def test_rope_qkv_matches_reference(
    device: str, dtype: torch.dtype, per_position: bool, close
) -> None:
    """The packed q|k|v op: q, k rotated and v (a view) as ref_rope_qkv gives them, and one
    gradient tensor equal to the reference's (GQA, odd T, more heads than one program's group)."""
    from ats_kernels import ref_rope_qkv
    from ats_kernels.triton import rope_qkv

    g = torch.Generator(device=device).manual_seed(0)
    for B, H, Hk, T, hd in _case(device) + [(2, 10, 9, 3, 6)]:
        cos, sin = rope_tables(hd, 2 * T, theta=10000.0, device=device)
        if per_position:
            pos = torch.randint(0, 2 * T, (B, T), generator=g, device=device)
            cos, sin = cos[pos], sin[pos]
        else:
            cos, sin = cos[:T], sin[:T]
        width = (H + 2 * Hk) * hd
        qkv = torch.randn(B, T, width, generator=g, device=device).to(dtype).requires_grad_()
        out = rope_qkv(qkv, cos, sin, H, Hk)
        ref = ref_rope_qkv(qkv, cos, sin, H, Hk)
        for name, a, b in zip("qkv", out, ref, strict=True):
            assert a.shape == b.shape, name
            close(a, b, name)
        assert out[2].data_ptr() == qkv.data_ptr() + (H + Hk) * hd * qkv.element_size()  # a view
        grads = [torch.randn(o.shape, generator=g, device=device).to(dtype) for o in out]
        (d,) = torch.autograd.grad(out, qkv, grads)
        (d_ref,) = torch.autograd.grad(ref, qkv, grads)
        close(d, d_ref, f"dqkv {(B, H, Hk, T, hd)}")


def test_rope_qkv_rejects_a_width_that_is_not_the_heads(device: str) -> None:
    from ats_kernels.triton import rope_qkv

    cos, sin = rope_tables(8, 4, device=device)
    with pytest.raises(ValueError, match="qkv width 30 is not 4 heads"):
        rope_qkv(torch.randn(1, 4, 30, device=device), cos, sin, 2, 1)
