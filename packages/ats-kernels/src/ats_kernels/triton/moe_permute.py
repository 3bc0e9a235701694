"""Triton MoE token permute (group slot copies by expert) and unpermute (weighted combine).

The stable expert sort is a counting sort: per block of slots an expert histogram, an exclusive
scan over blocks and experts (torch cumsum), then each slot's row = expert start + rows taken by
earlier blocks + its rank within the block (a cumsum of one-hot rows). The order is identical to
torch.argsort(stable=True) in ref_moe_permute. Row copies and combines are separate kernels.
"""

import torch
import triton
import triton.language as tl

from ats_kernels.triton.launch import check_on_device

BLOCK_C = 1024


@triton.jit
def _histogram_kernel(IDX, HIST, n_slots, E, BLOCK_S: tl.constexpr, BLOCK_E: tl.constexpr):
    b = tl.program_id(0)
    slots = b * BLOCK_S + tl.arange(0, BLOCK_S)
    experts = tl.arange(0, BLOCK_E)
    e = tl.load(IDX + slots, mask=slots < n_slots, other=-1)
    one_hot = (e[:, None] == experts[None, :]).to(tl.int32)  # (BLOCK_S, BLOCK_E)
    tl.store(HIST + b * E + experts, tl.sum(one_hot, axis=0), mask=experts < E)


@triton.jit
def _rank_kernel(
    IDX, BASE, POS, SORT_ORDER, n_slots, E, BLOCK_S: tl.constexpr, BLOCK_E: tl.constexpr
):
    b = tl.program_id(0)
    slots = b * BLOCK_S + tl.arange(0, BLOCK_S)
    s_mask = slots < n_slots
    experts = tl.arange(0, BLOCK_E)
    e = tl.load(IDX + slots, mask=s_mask, other=-1)
    one_hot = (e[:, None] == experts[None, :]).to(tl.int32)  # (BLOCK_S, BLOCK_E)
    rank = tl.cumsum(one_hot, axis=0) - one_hot  # earlier slots of the same expert in this block
    base = tl.load(BASE + b * E + experts, mask=experts < E, other=0)  # (BLOCK_E,)
    pos = tl.sum(tl.where(one_hot != 0, rank + base[None, :], 0), axis=1).to(tl.int64)
    tl.store(POS + slots, pos, mask=s_mask)
    tl.store(SORT_ORDER + pos, slots.to(tl.int64), mask=s_mask)


@triton.jit
def _gather_rows_kernel(
    X, SRC, Y, C, stride_x, stride_y, TOP_K: tl.constexpr, BLOCK_C: tl.constexpr
):
    """Y[i] = X[SRC[i] // TOP_K]: copy each slot's token row into its expert-sorted place."""
    i = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = cols < C
    token = tl.load(SRC + i) // TOP_K
    tl.store(Y + i * stride_y + cols, tl.load(X + token * stride_x + cols, mask=mask), mask=mask)


@triton.jit
def _combine_kernel(
    Y, POS, W, OUT, C, stride_y, stride_out,
    HAS_WEIGHTS: tl.constexpr, TOP_K: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    """OUT[n] = sum_j W[n, j] * Y[POS[n * k + j]] (W = 1 without weights: permute backward)."""
    n = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = cols < C
    acc = tl.zeros((BLOCK_C,), dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        row = tl.load(POS + n * TOP_K + j)
        y = tl.load(Y + row * stride_y + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_WEIGHTS:
            y = y * tl.load(W + n * TOP_K + j).to(tl.float32)
        acc += y
    tl.store(OUT + n * stride_out + cols, acc.to(OUT.dtype.element_ty), mask=mask)


@triton.jit
def _combine_bwd_kernel(
    DOUT, Y, POS, W, DY, DW, C, stride_dout, stride_y, stride_dy,
    TOP_K: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    """DY[POS[s]] = W[s] * DOUT[n] and DW[s] = <DOUT[n], Y[POS[s]]> for the k slots s of token n."""
    n = tl.program_id(0).to(tl.int64)
    for j in tl.static_range(TOP_K):
        row = tl.load(POS + n * TOP_K + j)
        w = tl.load(W + n * TOP_K + j).to(tl.float32)
        dot = tl.zeros((BLOCK_C,), dtype=tl.float32)
        for c0 in range(0, C, BLOCK_C):
            cols = c0 + tl.arange(0, BLOCK_C)
            mask = cols < C
            dout = tl.load(DOUT + n * stride_dout + cols, mask=mask, other=0.0).to(tl.float32)
            y = tl.load(Y + row * stride_y + cols, mask=mask, other=0.0).to(tl.float32)
            tl.store(DY + row * stride_dy + cols, (w * dout).to(DY.dtype.element_ty), mask=mask)
            dot += dout * y
        tl.store(DW + n * TOP_K + j, tl.sum(dot, axis=0).to(DW.dtype.element_ty))


def _rows(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _combine(
    y: torch.Tensor, pos: torch.Tensor, weights: torch.Tensor | None, n_tokens: int, top_k: int
):
    C = y.shape[1]
    out = torch.empty((n_tokens, C), device=y.device, dtype=y.dtype)
    if n_tokens > 0 and C > 0:
        _combine_kernel[(n_tokens, triton.cdiv(C, BLOCK_C))](
            y, pos, weights if weights is not None else pos, out, C, y.stride(0), out.stride(0),
            HAS_WEIGHTS=weights is not None, TOP_K=top_k, BLOCK_C=BLOCK_C, num_warps=4,
        )  # fmt: skip
    return out


def _sort_slots(
    indices: torch.Tensor, n_experts: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """indices (N, k) -> (tokens_per_expert (E,) int64, sort_order (N*k,), pos (N*k,) = its inverse)."""
    flat = indices.reshape(-1).contiguous()  # (N*k,)
    n_slots = flat.numel()
    block_e = triton.next_power_of_2(max(n_experts, 1))
    block_s = max(16, min(256, 8192 // block_e))
    n_blocks = triton.cdiv(n_slots, block_s)
    hist = torch.empty((n_blocks, n_experts), device=flat.device, dtype=torch.int32)
    pos = torch.empty(n_slots, device=flat.device, dtype=torch.int64)
    sort_order = torch.empty(n_slots, device=flat.device, dtype=torch.int64)
    if n_slots == 0:
        return torch.zeros(n_experts, device=flat.device, dtype=torch.int64), sort_order, pos
    _histogram_kernel[(n_blocks,)](flat, hist, n_slots, n_experts, BLOCK_S=block_s, BLOCK_E=block_e)
    counts = hist.sum(0, dtype=torch.int64)  # (E,)
    check_on_device(  # a slot matched no expert: index < 0 or >= n_experts
        counts.sum() == n_slots,
        f"moe_permute: an expert index is outside [0, n_experts = {n_experts})",
    )
    expert_start = torch.cumsum(counts, 0) - counts  # (E,)
    block_start = torch.cumsum(hist, 0, dtype=torch.int64) - hist  # (n_blocks, E) exclusive
    base = (block_start + expert_start[None, :]).to(torch.int32)
    _rank_kernel[(n_blocks,)](
        flat, base, pos, sort_order, n_slots, n_experts, BLOCK_S=block_s, BLOCK_E=block_e
    )
    return counts, sort_order, pos


class _MoEPermute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, indices: torch.Tensor, n_experts: int):
        N, C = x.shape
        top_k = indices.shape[1]
        counts, sort_order, pos = _sort_slots(indices, n_experts)
        x_sorted = torch.empty((N * top_k, C), device=x.device, dtype=x.dtype)
        if N > 0 and C > 0:
            _gather_rows_kernel[(N * top_k, triton.cdiv(C, BLOCK_C))](
                x, sort_order, x_sorted, C, x.stride(0), x_sorted.stride(0),
                TOP_K=top_k, BLOCK_C=BLOCK_C, num_warps=4,
            )  # fmt: skip
        ctx.save_for_backward(pos)
        ctx.n_tokens, ctx.top_k = N, top_k
        ctx.mark_non_differentiable(counts, sort_order)
        return x_sorted, counts, sort_order

    @staticmethod
    def backward(ctx, d_sorted, _d_counts, _d_order):
        (pos,) = ctx.saved_tensors
        return _combine(_rows(d_sorted), pos, None, ctx.n_tokens, ctx.top_k), None, None


class _MoEUnpermute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y_sorted: torch.Tensor, sort_order: torch.Tensor, weights: torch.Tensor):
        n_tokens, top_k = weights.shape
        pos = torch.empty_like(sort_order)
        pos[sort_order] = torch.arange(sort_order.numel(), device=sort_order.device)  # inverse
        out = _combine(y_sorted, pos, weights, n_tokens, top_k)
        ctx.save_for_backward(y_sorted, pos, weights)
        return out

    @staticmethod
    def backward(ctx, d_out: torch.Tensor):
        y_sorted, pos, weights = ctx.saved_tensors
        d_out = _rows(d_out)
        n_tokens, top_k = weights.shape
        C = y_sorted.shape[1]
        d_y = torch.empty_like(y_sorted)
        d_w = torch.empty_like(weights)
        if n_tokens > 0:
            _combine_bwd_kernel[(n_tokens,)](
                d_out, y_sorted, pos, weights, d_y, d_w, C,
                d_out.stride(0), y_sorted.stride(0), d_y.stride(0),
                TOP_K=top_k, BLOCK_C=min(BLOCK_C, triton.next_power_of_2(max(C, 1))), num_warps=4,
            )  # fmt: skip
        return d_y, None, d_w


def moe_permute(
    x: torch.Tensor, indices: torch.Tensor, n_experts: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Same result as ref_moe_permute -> (x_sorted (N*k, C), tokens_per_expert (E,) int64, sort_order)."""
    if x.dim() != 2 or indices.dim() != 2 or indices.shape[0] != x.shape[0]:
        raise ValueError(
            f"moe_permute: x {tuple(x.shape)} and indices {tuple(indices.shape)} must be (N, C), (N, k)"
        )
    return _MoEPermute.apply(_rows(x), indices, n_experts)


def moe_unpermute(
    y_sorted: torch.Tensor, sort_order: torch.Tensor, weights: torch.Tensor
) -> torch.Tensor:
    """Same result as ref_moe_unpermute: y_sorted (N*k, C), weights (N, k) -> (N, C) in fp32 sums."""
    if y_sorted.dim() != 2 or weights.dim() != 2 or y_sorted.shape[0] != weights.numel():
        raise ValueError(
            f"moe_unpermute: y_sorted {tuple(y_sorted.shape)} must have N*k = {weights.numel()} rows "
            f"for weights {tuple(weights.shape)}"
        )
    if sort_order.shape != (weights.numel(),):
        raise ValueError(
            f"moe_unpermute: sort_order shape {tuple(sort_order.shape)} != ({weights.numel()},)"
        )
    return _MoEUnpermute.apply(_rows(y_sorted), sort_order, weights.contiguous())
