"""Triton MoE routing: softmax with temperature, top-k choice and per-expert counts in one kernel.

A program holds BLOCK_N rows of router logits, computes fp32 probabilities, then takes the top-k
by k rounds of argmax (ties to the lower expert index), optionally shifted by the selection-only
bias (DeepSeek-V3 aux-loss-free balancing) and renormalized. Backward is a torch formula of the
softmax / gather / renormalize gradient, which is cheap at (N, E).
"""

import torch
import triton
import triton.language as tl

_IO_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def _moe_route_kernel(
    L, stride_l, BIAS, W_OUT, IDX_OUT, PROBS, COUNTS,
    N, E, inv_temperature,
    TOP_K: tl.constexpr, K_PAD: tl.constexpr, HAS_BIAS: tl.constexpr, NORM_TOPK: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_E: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, BLOCK_E)
    r_mask = rows < N
    c_mask = cols < E
    mask = r_mask[:, None] & c_mask[None, :]
    x = tl.load(L + rows[:, None] * stride_l + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    x = tl.where(c_mask[None, :], x * inv_temperature, float("-inf"))
    x = x - tl.max(x, axis=1)[:, None]
    e = tl.exp(x)
    probs = e / tl.sum(e, axis=1)[:, None]  # (BLOCK_N, BLOCK_E)
    tl.store(PROBS + rows[:, None] * E + cols[None, :], probs, mask=mask)
    scores = probs
    if HAS_BIAS:
        scores = probs + tl.load(BIAS + cols, mask=c_mask, other=0.0).to(tl.float32)[None, :]
    scores = tl.where(c_mask[None, :], scores, float("-inf"))
    ks = tl.arange(0, K_PAD)
    top_w = tl.zeros((BLOCK_N, K_PAD), dtype=tl.float32)
    top_i = tl.zeros((BLOCK_N, K_PAD), dtype=tl.int64)
    for j in tl.static_range(TOP_K):
        idx = tl.argmax(scores, axis=1, tie_break_left=True)  # (BLOCK_N,)
        chosen = cols[None, :] == idx[:, None]
        w_j = tl.sum(tl.where(chosen, probs, 0.0), axis=1)
        top_w = tl.where(ks[None, :] == j, w_j[:, None], top_w)
        top_i = tl.where(ks[None, :] == j, idx.to(tl.int64)[:, None], top_i)
        scores = tl.where(chosen, float("-inf"), scores)
        tl.atomic_add(COUNTS + idx, tl.full((BLOCK_N,), 1, tl.int32), mask=r_mask)
    if NORM_TOPK:
        top_w = top_w / tl.sum(top_w, axis=1)[:, None]
    k_mask = r_mask[:, None] & (ks < TOP_K)[None, :]
    out = rows[:, None] * TOP_K + ks[None, :]
    tl.store(W_OUT + out, top_w.to(W_OUT.dtype.element_ty), mask=k_mask)
    tl.store(IDX_OUT + out, top_i, mask=k_mask)


def _route(logits, top_k, temperature, bias, norm_topk):
    N, E = logits.shape
    weights = torch.empty((N, top_k), device=logits.device, dtype=logits.dtype)
    indices = torch.empty((N, top_k), device=logits.device, dtype=torch.int64)
    probs = torch.empty((N, E), device=logits.device, dtype=torch.float32)
    counts = torch.zeros((E,), device=logits.device, dtype=torch.int32)
    block_e = triton.next_power_of_2(E)
    block_n = max(1, min(64, 4096 // block_e))
    if N > 0:
        _moe_route_kernel[(triton.cdiv(N, block_n),)](
            logits, logits.stride(0), bias if bias is not None else probs,
            weights, indices, probs, counts,
            N, E, 1.0 / temperature,
            TOP_K=top_k, K_PAD=triton.next_power_of_2(top_k), HAS_BIAS=bias is not None,
            NORM_TOPK=norm_topk, BLOCK_N=block_n, BLOCK_E=block_e, num_warps=4,
        )  # fmt: skip
    return weights, indices, probs, counts.to(torch.int64)


class _MoERoute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, top_k, temperature, bias, norm_topk):
        weights, indices, probs, counts = _route(logits, top_k, temperature, bias, norm_topk)
        ctx.save_for_backward(probs, indices)
        ctx.temperature, ctx.norm_topk, ctx.logits_dtype = temperature, norm_topk, logits.dtype
        ctx.mark_non_differentiable(indices, counts)
        return weights, indices, probs, counts

    @staticmethod
    def backward(ctx, d_weights, _d_indices, d_probs, _d_counts):
        probs, indices = ctx.saved_tensors
        dp = torch.zeros_like(probs) if d_probs is None else d_probs.to(torch.float32).clone()
        if d_weights is not None:
            dw = d_weights.to(torch.float32)  # (N, k)
            if ctx.norm_topk:
                # w = g / sum(g), g = probs gathered: dg = (dw - sum(dw * w)) / sum(g)
                g = probs.gather(-1, indices)
                g_sum = g.sum(-1, keepdim=True)
                w = g / g_sum
                dw = (dw - (dw * w).sum(-1, keepdim=True)) / g_sum
            dp.scatter_add_(-1, indices, dw)
        # softmax backward, then the 1/temperature of the logits scaling
        d_logits = probs * (dp - (dp * probs).sum(-1, keepdim=True)) / ctx.temperature
        return d_logits.to(ctx.logits_dtype), None, None, None, None


def _check(logits: torch.Tensor, top_k: int, temperature: float, bias: torch.Tensor | None) -> None:
    if logits.dim() != 2 or logits.dtype not in _IO_DTYPES:
        raise ValueError(
            f"moe_route: logits must be 2-D {_IO_DTYPES}, got {tuple(logits.shape)} {logits.dtype}"
        )
    n_experts = logits.shape[-1]
    if not 1 <= top_k <= n_experts:
        raise ValueError(f"moe_route: top_k = {top_k} must be in [1, n_experts = {n_experts}]")
    if not temperature > 0:
        raise ValueError(f"moe_route: temperature = {temperature} must be > 0")
    if bias is not None and bias.shape != (n_experts,):
        raise ValueError(f"moe_route: bias shape {tuple(bias.shape)} != ({n_experts},)")


def moe_route(
    logits: torch.Tensor,
    top_k: int,
    temperature: float = 1.0,
    bias: torch.Tensor | None = None,
    norm_topk: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Same result as ref_moe_route -> (weights (N, k) logits.dtype, indices (N, k) int64,
    probs (N, E) fp32, counts (E,) int64 counted in the same kernel with atomics)."""
    _check(logits, top_k, temperature, bias)
    logits = logits if logits.stride(-1) == 1 else logits.contiguous()
    bias = None if bias is None else bias.detach().contiguous()
    return _MoERoute.apply(logits, top_k, float(temperature), bias, norm_topk)
