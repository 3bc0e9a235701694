"""Triton RoPE for q and k in one launch, forward + backward (HF half-split convention).

One program per (block of positions, batch, group of 8 heads of q or k) loads the cos/sin tile once
and rotates each head's (positions x head_dim) slab. Outputs, and in backward the input gradients,
take the layout of the q and k passed in (the model's transposed (B, T, H, hd) views stay free to
backpropagate through). Backward is the transposed rotation (rope with -sin, halves swapped).
Tuning history and the ladder that times it: packages/ats-kernels/dev/rope/ (this is 03).

rope_qkv takes the output of one fused q|k|v projection: it reads q and k out of it, returns v
as a view, and in backward writes the rotated dq, dk and the copied dv into one gradient tensor,
which the projection's backward consumes as one GEMM (no sum of three input gradients). Its
kernels take that tensor whole with column offsets (see swiglu.py's _SwiGLUPacked for why).
"""

import torch
import triton
import triton.language as tl

_IO_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
TILE = 2048  # elements of each half per (position block, head): 32 positions of head_dim 128
HEADS = 8  # heads per program sharing one read of the cos/sin tile


@triton.jit
def _tables(COS, SIN, b, scb, sct, t, d, mask, half, X):
    """The (BLOCK_T, BLOCK_HALF) cos/sin halves of these positions in fp32, rounded to X's dtype
    first, as ref_rope does (cos.to(q.dtype))."""
    tab = b * scb + t.to(tl.int64)[:, None] * sct + d[None, :]
    c1 = tl.load(COS + tab, mask=mask, other=0.0).to(X.dtype.element_ty).to(tl.float32)
    c2 = tl.load(COS + tab + half, mask=mask, other=0.0).to(X.dtype.element_ty).to(tl.float32)
    s1 = tl.load(SIN + tab, mask=mask, other=0.0).to(X.dtype.element_ty).to(tl.float32)
    s2 = tl.load(SIN + tab + half, mask=mask, other=0.0).to(X.dtype.element_ty).to(tl.float32)
    return c1, c2, s1, s2


@triton.jit
def _rotate(x1, x2, c1, c2, s1, s2, BACKWARD: tl.constexpr):
    if BACKWARD:
        # transpose of [[c1, -s1], [s2, c2]]
        y1 = x1 * c1 + x2 * s2
        y2 = x2 * c2 - x1 * s1
    else:
        y1 = x1 * c1 - x2 * s1
        y2 = x2 * c2 + x1 * s2
    return y1, y2


@triton.jit
def _rotate_head(x_row, y_row, mask, half, c1, c2, s1, s2, BACKWARD: tl.constexpr):
    """One head's (BLOCK_T, BLOCK_HALF) halves at x_row, rotated, stored at y_row."""
    x1 = tl.load(x_row, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_row + half, mask=mask, other=0.0).to(tl.float32)
    y1, y2 = _rotate(x1, x2, c1, c2, s1, s2, BACKWARD)
    tl.store(y_row, y1.to(y_row.dtype.element_ty), mask=mask)
    tl.store(y_row + half, y2.to(y_row.dtype.element_ty), mask=mask)


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
    # (BLOCK_T, BLOCK_HALF) tables, read once per program and reused by HEADS heads
    c1, c2, s1, s2 = _tables(COS, SIN, b, scb, sct, t, d, mask, half, Q)
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
        _rotate_head(x_row, y_row, mask, half, c1, c2, s1, s2, BACKWARD)
        x_row += sxh
        y_row += syh


@triton.jit
def _rope_qkv_fwd_kernel(
    QKV, QO, KO, COS, SIN,
    sxb, sxt, sqob, sqoh, sqot, skob, skoh, skot, scb, sct,
    T, n_q_heads, n_k_heads, hd, half,
    HEADS: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_HALF: tl.constexpr,
):  # fmt: skip
    # program (t block, b, head group): groups [0, n_q_groups) are q heads, the rest k heads;
    # head h of q starts at column h * hd of a qkv row, head h of k at (n_q_heads + h) * hd
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    b = tl.program_id(1).to(tl.int64)
    group = tl.program_id(2)
    n_q_groups = tl.cdiv(n_q_heads, HEADS)
    d = tl.arange(0, BLOCK_HALF)
    mask = (t < T)[:, None] & (d < half)[None, :]
    c1, c2, s1, s2 = _tables(COS, SIN, b, scb, sct, t, d, mask, half, QKV)
    is_k = group >= n_q_groups
    h0 = tl.where(is_k, group - n_q_groups, group) * HEADS
    n_heads = tl.where(is_k, n_k_heads, n_q_heads)
    first_col = (tl.where(is_k, n_q_heads, 0) + h0) * hd
    if is_k:
        Y, syb, syh, syt = KO, skob, skoh, skot
    else:
        Y, syb, syh, syt = QO, sqob, sqoh, sqot
    x_row = QKV + b * sxb + t.to(tl.int64)[:, None] * sxt + first_col + d[None, :]
    y_row = Y + b * syb + h0 * syh + t.to(tl.int64)[:, None] * syt + d[None, :]
    for _ in range(h0, tl.minimum(h0 + HEADS, n_heads)):
        _rotate_head(x_row, y_row, mask, half, c1, c2, s1, s2, False)
        x_row += hd
        y_row += syh


@triton.jit
def _rope_qkv_bwd_kernel(
    DQ, DK, DV, DQKV, COS, SIN,
    sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, syb, syt, scb, sct,
    T, n_q_heads, n_k_heads, hd, half,
    HEADS: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_HALF: tl.constexpr,
):  # fmt: skip
    # program (t block, b, head group): q groups, then k groups (both rotated back), then v
    # groups (copied); each writes its heads' columns of the one (B, T, width) gradient. Each of
    # dq, dk, dv is read through its own masked load rather than a pointer chosen by a branch:
    # on the H200 this form took 1.20 ms per 124M step against 1.84 ms for the branch form.
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    b = tl.program_id(1).to(tl.int64)
    group = tl.program_id(2)
    n_q_groups = tl.cdiv(n_q_heads, HEADS)
    n_k_groups = tl.cdiv(n_k_heads, HEADS)
    d = tl.arange(0, BLOCK_HALF)
    mask = (t < T)[:, None] & (d < half)[None, :]
    c1, c2, s1, s2 = _tables(COS, SIN, b, scb, sct, t, d, mask, half, DQKV)
    is_q = group < n_q_groups
    is_v = group >= n_q_groups + n_k_groups
    is_k = ~is_q & ~is_v
    h0 = (group - tl.where(is_v, n_q_groups + n_k_groups, tl.where(is_k, n_q_groups, 0))) * HEADS
    n_heads = tl.where(is_q, n_q_heads, n_k_heads)
    section = tl.where(is_v, n_q_heads + n_k_heads, tl.where(is_k, n_q_heads, 0))
    t64 = t.to(tl.int64)[:, None]
    y_row = DQKV + b * syb + t64 * syt + (section + h0) * hd + d[None, :]
    # per-tensor masks (tl.where: Triton's interpreter rejects a block mask & a scalar flag)
    q_mask = tl.where(is_q, mask, False)
    k_mask = tl.where(is_k, mask, False)
    v_mask = tl.where(is_v, mask, False)
    for h in range(h0, tl.minimum(h0 + HEADS, n_heads)):
        q_at = DQ + b * sqb + h * sqh + t64 * sqt + d[None, :]
        k_at = DK + b * skb + h * skh + t64 * skt + d[None, :]
        v_at = DV + b * svb + h * svh + t64 * svt + d[None, :]
        q1 = tl.load(q_at, mask=q_mask, other=0.0).to(tl.float32)
        q2 = tl.load(q_at + half, mask=q_mask, other=0.0).to(tl.float32)
        k1 = tl.load(k_at, mask=k_mask, other=0.0).to(tl.float32)
        k2 = tl.load(k_at + half, mask=k_mask, other=0.0).to(tl.float32)
        v1 = tl.load(v_at, mask=v_mask, other=0.0).to(tl.float32)
        v2 = tl.load(v_at + half, mask=v_mask, other=0.0).to(tl.float32)
        r1, r2 = _rotate(tl.where(is_q, q1, k1), tl.where(is_q, q2, k2), c1, c2, s1, s2, True)
        y1 = tl.where(is_v, v1, r1)
        y2 = tl.where(is_v, v2, r2)
        tl.store(y_row, y1.to(DQKV.dtype.element_ty), mask=mask)
        tl.store(y_row + half, y2.to(DQKV.dtype.element_ty), mask=mask)
        y_row += hd


def _unit_last(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _launch_shape(T: int, hd: int) -> tuple[int, int]:
    """(BLOCK_T, BLOCK_HALF): TILE elements of each half per (position block, head)."""
    block_half = triton.next_power_of_2(hd // 2)
    return max(1, min(triton.next_power_of_2(T), TILE // block_half)), block_half


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
    block_t, block_half = _launch_shape(T, hd)
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


def _check_tables(cos: torch.Tensor, sin: torch.Tensor, B: int, T: int, hd: int, op: str) -> None:
    expect = (T, hd) if cos.dim() == 2 else (B, T, hd)
    if cos.dim() not in (2, 3) or cos.shape != expect or sin.shape != cos.shape:
        raise ValueError(
            f"{op}: cos {tuple(cos.shape)} / sin {tuple(sin.shape)} must be (T, hd) or (B, T, hd) "
            f"with T = {T}, hd = {hd}, B = {B}"
        )
    if cos.requires_grad or sin.requires_grad:
        raise ValueError(
            f"{op}: the Triton kernel gives no gradient to cos/sin; pass tables without grad"
        )


def _shared_tables(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin with a unit last stride and one set of strides (the kernels take one)."""
    cos, sin = _unit_last(cos), _unit_last(sin)
    if cos.stride() != sin.stride():
        cos, sin = cos.contiguous(), sin.contiguous()
    return cos, sin


class _RoPEQKV(torch.autograd.Function):
    @staticmethod
    def forward(ctx, qkv, cos, sin, n_head: int, n_kv_head: int):
        B, T, width = qkv.shape
        hd = width // (n_head + 2 * n_kv_head)
        # (B, heads, T, hd) views of (B, T, heads, hd) buffers, the layout of the projection
        qo = qkv.new_empty(B, T, n_head, hd).transpose(1, 2)
        ko = qkv.new_empty(B, T, n_kv_head, hd).transpose(1, 2)
        scb = cos.stride(0) if cos.dim() == 3 else 0  # (T, hd) tables are shared by the batch
        block_t, block_half = _launch_shape(T, hd)
        groups = triton.cdiv(n_head, HEADS) + triton.cdiv(n_kv_head, HEADS)
        _rope_qkv_fwd_kernel[(triton.cdiv(T, block_t), B, groups)](
            qkv, qo, ko, cos, sin,
            qkv.stride(0), qkv.stride(1),
            qo.stride(0), qo.stride(1), qo.stride(2), ko.stride(0), ko.stride(1), ko.stride(2),
            scb, cos.stride(-2),
            T, n_head, n_kv_head, hd, hd // 2,
            HEADS=HEADS, BLOCK_T=block_t, BLOCK_HALF=block_half, num_warps=8,
        )  # fmt: skip
        v = qkv.view(B, T, n_head + 2 * n_kv_head, hd)[:, :, n_head + n_kv_head :]
        ctx.save_for_backward(cos, sin)
        ctx.heads = (n_head, n_kv_head)
        return qo, ko, v.transpose(1, 2)

    @staticmethod
    def backward(ctx, dq, dk, dv):
        cos, sin = ctx.saved_tensors
        n_head, n_kv_head = ctx.heads
        return _rope_qkv_backward(dq, dk, dv, cos, sin, n_head, n_kv_head), None, None, None, None


# The launch reads the gradients' strides, so it is a custom op that torch.compile does not trace
# into: when a custom Function's backward reads a gradient's strides, dynamo traces it again with
# every gradient made contiguous (torch._dynamo.config._autograd_backward_strict_mode_
# conditional_banned_ops), a (B, T, C) copy each of dq, dk and dv per layer. The stride-order tag
# keeps the gradients as the attention's backward wrote them.
@torch.library.custom_op(
    "ats_kernels::rope_qkv_backward", mutates_args=(), tags=(torch.Tag.needs_fixed_stride_order,)
)
def _rope_qkv_backward(
    dq: torch.Tensor,
    dk: torch.Tensor,
    dv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    n_head: int,
    n_kv_head: int,
) -> torch.Tensor:
    B, _, T, hd = dq.shape
    dqkv = dq.new_empty(B, T, (n_head + 2 * n_kv_head) * hd)
    scb = cos.stride(0) if cos.dim() == 3 else 0
    block_t, block_half = _launch_shape(T, hd)
    groups = triton.cdiv(n_head, HEADS) + 2 * triton.cdiv(n_kv_head, HEADS)
    dq, dk, dv = _unit_last(dq), _unit_last(dk), _unit_last(dv)
    _rope_qkv_bwd_kernel[(triton.cdiv(T, block_t), B, groups)](
        dq, dk, dv, dqkv, cos, sin,
        dq.stride(0), dq.stride(1), dq.stride(2), dk.stride(0), dk.stride(1), dk.stride(2),
        dv.stride(0), dv.stride(1), dv.stride(2), dqkv.stride(0), dqkv.stride(1),
        scb, cos.stride(-2),
        T, n_head, n_kv_head, hd, hd // 2,
        HEADS=HEADS, BLOCK_T=block_t, BLOCK_HALF=block_half, num_warps=8,
    )  # fmt: skip
    return dqkv


@_rope_qkv_backward.register_fake
def _(dq, dk, dv, cos, sin, n_head: int, n_kv_head: int) -> torch.Tensor:
    B, _, T, hd = dq.shape
    return dq.new_empty(B, T, (n_head + 2 * n_kv_head) * hd)


def rope_qkv(
    qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, n_head: int, n_kv_head: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Same result as ref_rope_qkv: qkv (B, T, (n_head + 2 n_kv_head) hd) -> q, k rotated and v,
    each (B, heads, T, hd); the gradient comes back as one tensor of qkv's shape."""
    if qkv.dim() != 3:
        raise ValueError(f"rope_qkv: qkv must be 3-D (B, T, width), got {tuple(qkv.shape)}")
    B, T, width = qkv.shape
    heads = n_head + 2 * n_kv_head
    if width % heads or (width // heads) % 2:
        raise ValueError(
            f"rope_qkv: qkv width {width} is not {heads} heads (n_head {n_head} + 2 x n_kv_head "
            f"{n_kv_head}) of an even head_dim"
        )
    if qkv.dtype not in _IO_DTYPES:
        raise TypeError(
            f"rope_qkv: qkv.dtype = {qkv.dtype}; the Triton kernel supports {_IO_DTYPES}"
        )
    _check_tables(cos, sin, B, T, width // heads, "rope_qkv")
    cos, sin = _shared_tables(cos, sin)
    return _RoPEQKV.apply(qkv.contiguous(), cos, sin, n_head, n_kv_head)


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
    _check_tables(cos, sin, B, T, hd, "rope")
    cos, sin = _shared_tables(cos, sin)
    return _RoPE.apply(q, k, cos, sin)
