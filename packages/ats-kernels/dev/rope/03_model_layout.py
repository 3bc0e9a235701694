"""03_model_layout: 02's kernel, with outputs (and, in backward, the input gradients) allocated in
the layout of the tensors the model passes in, instead of contiguous (B, H, T, hd).

Why: the model's q is wq(x).view(B, T, H, hd).transpose(1, 2), memory (B, T, H, hd). 02 returns
dq contiguous in (B, H, T, hd), so autograd's transpose + view backward must .reshape() it into
(B, T, H*hd) for wq's weight gradient: one hidden copy of dq and one of dk (read + write 2 x 160
MiB at 16384x4096) per layer per step. Here dq lands in (B, T, H, hd) memory, the view is free.
On (B, T, H, hd) memory a head step is 256 B, a position step H*hd: 02's (32 positions x 64)
tiles become 32 rows of 128 B per load (whole 128-byte lines, still coalesced).
PREDICTION: contiguous (B, H, T, hd) case: same as 02 (same kernel, same layout). Model layout
(the `bthd` rows, the closure includes the view/transpose as the model has them): ~0.17 ms GPU
less than 02 (the two reshape copies of 320 MiB each direction no longer run).
"""

import torch
import triton
import triton.language as tl

_IO_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
TILE = 2048  # elements of each half per (position block, head): 32 positions of head_dim 128
HEADS = 8  # heads per program sharing one read of the cos/sin tile


@triton.jit
def _rope_kernel(
    Q, K, QO, KO, COS, SIN,
    sqb, sqh, sqt, skb, skh, skt,
    sqob, sqoh, sqot, skob, skoh, skot,
    scb, sct,
    T, n_q_heads, n_k_heads, half,
    BACKWARD: tl.constexpr, HEADS: tl.constexpr, BLOCK_T: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):  # fmt: skip
    # program (t block, b, head group): groups [0, n_q_groups) are q heads, the rest k heads
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    b = tl.program_id(1).to(tl.int64)
    group = tl.program_id(2).to(tl.int64)
    n_q_groups = tl.cdiv(n_q_heads, HEADS)
    d = tl.arange(0, BLOCK_HALF)
    mask = (t < T)[:, None] & (d < half)[None, :]
    # (BLOCK_T, BLOCK_HALF) tables, read once per program and reused by HEADS heads; rounded to
    # x.dtype first, as ref_rope does (cos.to(q.dtype))
    tab = b * scb + t.to(tl.int64)[:, None] * sct + d[None, :]
    c1 = tl.load(COS + tab, mask=mask, other=0.0).to(Q.dtype.element_ty).to(tl.float32)
    c2 = tl.load(COS + tab + half, mask=mask, other=0.0).to(Q.dtype.element_ty).to(tl.float32)
    s1 = tl.load(SIN + tab, mask=mask, other=0.0).to(Q.dtype.element_ty).to(tl.float32)
    s2 = tl.load(SIN + tab + half, mask=mask, other=0.0).to(Q.dtype.element_ty).to(tl.float32)
    if group < n_q_groups:
        X, Y, n_heads, h0 = Q, QO, n_q_heads, group * HEADS
        sxb, sxh, sxt, syb, syh, syt = sqb, sqh, sqt, sqob, sqoh, sqot
    else:
        X, Y, n_heads, h0 = K, KO, n_k_heads, (group - n_q_groups) * HEADS
        sxb, sxh, sxt, syb, syh, syt = skb, skh, skt, skob, skoh, skot
    # (BLOCK_T, BLOCK_HALF) pointers into head h0, stepped by one head per iteration
    x_row = X + b * sxb + h0 * sxh + t.to(tl.int64)[:, None] * sxt + d[None, :]
    y_row = Y + b * syb + h0 * syh + t.to(tl.int64)[:, None] * syt + d[None, :]
    for _ in range(h0, tl.minimum(h0 + HEADS, n_heads)):
        x1 = tl.load(x_row, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(x_row + half, mask=mask, other=0.0).to(tl.float32)
        if BACKWARD:
            # transpose of [[c1, -s1], [s2, c2]]
            y1 = x1 * c1 + x2 * s2
            y2 = x2 * c2 - x1 * s1
        else:
            y1 = x1 * c1 - x2 * s1
            y2 = x2 * c2 + x1 * s2
        tl.store(y_row, y1.to(Y.dtype.element_ty), mask=mask)
        tl.store(y_row + half, y2.to(Y.dtype.element_ty), mask=mask)
        x_row += sxh
        y_row += syh


def _unit_last(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _launch(
    q, k, cos, sin, backward: bool, q_stride=None, k_stride=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rotated q, rotated k); strides of the outputs: q's and k's, or the given ones."""
    B, Hq, T, hd = q.shape
    Hk = k.shape[1]
    q, k = _unit_last(q), _unit_last(k)
    # outputs in the inputs' memory order (empty_like keeps the strides of dense tensors)
    qo = torch.empty_like(q) if q_stride is None else q.new_empty_strided(q.shape, q_stride)
    ko = torch.empty_like(k) if k_stride is None else k.new_empty_strided(k.shape, k_stride)
    scb = cos.stride(0) if cos.dim() == 3 else 0  # (T, hd) tables are shared by the batch
    sct = cos.stride(-2)
    half = hd // 2
    block_half = triton.next_power_of_2(half)
    block_t = max(1, min(triton.next_power_of_2(T), TILE // block_half))
    n_groups = triton.cdiv(Hq, HEADS) + triton.cdiv(Hk, HEADS)
    _rope_kernel[(triton.cdiv(T, block_t), B, n_groups)](
        q, k, qo, ko, cos, sin,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        qo.stride(0), qo.stride(1), qo.stride(2), ko.stride(0), ko.stride(1), ko.stride(2),
        scb, sct,
        T, Hq, Hk, half,
        BACKWARD=backward, HEADS=HEADS, BLOCK_T=block_t, BLOCK_HALF=block_half, num_warps=8,
    )  # fmt: skip
    return qo, ko


class _RoPE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, cos, sin):
        ctx.save_for_backward(cos, sin)
        q_out, k_out = _launch(q, k, cos, sin, backward=False)
        # the input gradients take the inputs' layout, so the model's view/transpose stays free
        ctx.q_stride, ctx.k_stride = q_out.stride(), k_out.stride()
        return q_out, k_out

    @staticmethod
    def backward(ctx, dq, dk):
        cos, sin = ctx.saved_tensors
        dq_in, dk_in = _launch(dq, dk, cos, sin, True, ctx.q_stride, ctx.k_stride)
        return dq_in, dk_in, None, None


def rope(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same result as ref_rope: q (B, n_head, T, hd), k (B, n_kv_head, T, hd), any strides;
    cos/sin (T, hd) or (B, T, hd). Outputs take q's and k's layout; no gradient flows to cos/sin."""
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
