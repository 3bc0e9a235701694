"""01_baseline: the production RoPE before the H200 tuning (issue 5), kept for the ladder.

Measured on the H200 (q 4x32x4096x128, k 4x8x4096x128, bf16, fwd+bwd): 0.546 ms, 29% of copy.
Diagnosis: one program per (b, t) touches 40 scattered 256-byte head rows 1 MiB apart (poor DRAM
locality, small requests), with 16384 tiny programs of 4 warps.
"""

import torch
import triton
import triton.language as tl

_IO_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def _rotate_heads(
    X, Y, COS, SIN, b, t,
    sxb, sxh, sxt, syb, syh, syt,
    n_heads, half,
    BACKWARD: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr,
):  # fmt: skip
    """Rotate the (n_heads, hd) slab X[b, :, t, :] into Y[b, :, t, :]; COS/SIN point at this row."""
    d = tl.arange(0, BLOCK_HALF)
    d_mask = d < half
    # tables rounded to x.dtype first, as ref_rope does (cos.to(q.dtype))
    c1 = tl.load(COS + d, mask=d_mask, other=0.0).to(X.dtype.element_ty).to(tl.float32)
    c2 = tl.load(COS + half + d, mask=d_mask, other=0.0).to(X.dtype.element_ty).to(tl.float32)
    s1 = tl.load(SIN + d, mask=d_mask, other=0.0).to(X.dtype.element_ty).to(tl.float32)
    s2 = tl.load(SIN + half + d, mask=d_mask, other=0.0).to(X.dtype.element_ty).to(tl.float32)
    for h0 in range(0, n_heads, BLOCK_H):
        h = h0 + tl.arange(0, BLOCK_H)
        mask = (h < n_heads)[:, None] & d_mask[None, :]
        x_row = X + b * sxb + t * sxt + h[:, None] * sxh + d[None, :]  # (BLOCK_H, BLOCK_HALF)
        x1 = tl.load(x_row, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(x_row + half, mask=mask, other=0.0).to(tl.float32)
        if BACKWARD:
            # transpose of [[c1, -s1], [s2, c2]]
            y1 = x1 * c1[None, :] + x2 * s2[None, :]
            y2 = x2 * c2[None, :] - x1 * s1[None, :]
        else:
            y1 = x1 * c1[None, :] - x2 * s1[None, :]
            y2 = x2 * c2[None, :] + x1 * s2[None, :]
        y_row = Y + b * syb + t * syt + h[:, None] * syh + d[None, :]
        tl.store(y_row, y1.to(Y.dtype.element_ty), mask=mask)
        tl.store(y_row + half, y2.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _rope_kernel(
    Q, K, QO, KO, COS, SIN,
    sqb, sqh, sqt, skb, skh, skt,
    sqob, sqoh, sqot, skob, skoh, skot,
    scb, sct,
    T, n_q_heads, n_k_heads, half,
    BACKWARD: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0).to(tl.int64)
    b = pid // T
    t = pid % T
    cos_row = COS + b * scb + t * sct
    sin_row = SIN + b * scb + t * sct
    _rotate_heads(Q, QO, cos_row, sin_row, b, t, sqb, sqh, sqt, sqob, sqoh, sqot,
                  n_q_heads, half, BACKWARD, BLOCK_HQ, BLOCK_HALF)  # fmt: skip
    _rotate_heads(K, KO, cos_row, sin_row, b, t, skb, skh, skt, skob, skoh, skot,
                  n_k_heads, half, BACKWARD, BLOCK_HK, BLOCK_HALF)  # fmt: skip


def _unit_last(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _launch(q, k, cos, sin, backward: bool) -> tuple[torch.Tensor, torch.Tensor]:
    B, Hq, T, hd = q.shape
    Hk = k.shape[1]
    q, k = _unit_last(q), _unit_last(k)
    qo = torch.empty((B, Hq, T, hd), device=q.device, dtype=q.dtype)
    ko = torch.empty((B, Hk, T, hd), device=k.device, dtype=k.dtype)
    scb = cos.stride(0) if cos.dim() == 3 else 0  # (T, hd) tables are shared by the batch
    sct = cos.stride(-2)
    half = hd // 2
    block_half = triton.next_power_of_2(half)
    # ~4k elements of each half per head block keeps registers in check
    block_hq = min(triton.next_power_of_2(Hq), max(1, 4096 // block_half))
    block_hk = min(triton.next_power_of_2(Hk), max(1, 4096 // block_half))
    _rope_kernel[(B * T,)](
        q, k, qo, ko, cos, sin,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        qo.stride(0), qo.stride(1), qo.stride(2), ko.stride(0), ko.stride(1), ko.stride(2),
        scb, sct,
        T, Hq, Hk, half,
        BACKWARD=backward, BLOCK_HQ=block_hq, BLOCK_HK=block_hk, BLOCK_HALF=block_half,
        num_warps=4,
    )  # fmt: skip
    return qo, ko


class _RoPE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, cos, sin):
        ctx.save_for_backward(cos, sin)
        return _launch(q, k, cos, sin, backward=False)

    @staticmethod
    def backward(ctx, dq, dk):
        cos, sin = ctx.saved_tensors
        dq_in, dk_in = _launch(dq, dk, cos, sin, backward=True)
        return dq_in, dk_in, None, None


def rope(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same result as ref_rope: q (B, n_head, T, hd), k (B, n_kv_head, T, hd), any strides;
    cos/sin (T, hd) or (B, T, hd). Outputs are contiguous; no gradient flows to cos/sin."""
    if q.dim() != 4 or k.dim() != 4:
        raise ValueError(
            f"rope: q and k must be 4-D (B, H, T, hd), got {tuple(q.shape)}, {tuple(k.shape)}"
        )
    B, _, T, hd = q.shape
    if k.shape[0] != B or k.shape[2:] != (T, hd) or k.dtype != q.dtype:
        raise ValueError(
            f"rope: k {tuple(k.shape)} {k.dtype} does not match q {tuple(q.shape)} {q.dtype}"
        )
    if q.dtype not in _IO_DTYPES:
        raise TypeError(f"rope: q.dtype = {q.dtype}; the Triton kernel supports {_IO_DTYPES}")
    if hd % 2 != 0:
        raise ValueError(f"rope: head_dim = {hd} must be even")
    expect = (T, hd) if cos.dim() == 2 else (B, T, hd)
    if cos.dim() not in (2, 3) or cos.shape != expect or sin.shape != cos.shape:
        raise ValueError(
            f"rope: cos {tuple(cos.shape)} / sin {tuple(sin.shape)} must be (T, hd) or (B, T, hd) "
            f"with T = {T}, hd = {hd}, B = {B}"
        )
    if cos.requires_grad or sin.requires_grad:
        raise ValueError(
            "rope: the Triton kernel gives no gradient to cos/sin; pass tables without grad"
        )
    cos, sin = _unit_last(cos), _unit_last(sin)
    if cos.stride() != sin.stride():
        cos, sin = cos.contiguous(), sin.contiguous()
    return _RoPE.apply(q, k, cos, sin)
