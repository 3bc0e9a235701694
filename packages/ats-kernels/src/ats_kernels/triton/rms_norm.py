"""Triton RMSNorm, optionally fused with the residual add, forward + backward.

Matches ref_rms_norm (HF LlamaRMSNorm order): fp32 statistics, the normalized row rounded to
x.dtype, then scaled by weight. Forward: tiles of several rows per program. Backward: a persistent
grid sized so every program is resident at once, each prefetching its next row tile while reducing
the current one; dw as per-program partial sums reduced by one torch sum (as Liger and Apex do).
Tuning history and the ladder that times it: packages/ats-kernels/dev/rms_norm/.
"""

import torch
import triton
import triton.language as tl

from ats_kernels.triton.launch import n_persistent_programs, row_block

_IO_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# elements per forward program at 4 warps (8 from rows of 8192 up): 4 rows of 768 or one of 4096;
# 8192-element tiles at 16 warps were 18-22% slower at both widths (H200 sweep, bf16)
FWD_TILE = 4096
# elements per backward iteration (the prefetched next tile doubles the registers): one row of
# 4096 at 8 warps, or two rows of 768 (padded to 1024) at 4 warps, 4 programs per SM -- at
# 32768 x 768 (the 124M model) 2x the bandwidth of 4096-element tiles at 8 warps (H200 sweep)
BWD_TILE = 2048


def _tile(n_cols: int, tile: int, per_thread: int, op: str) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps): whole rows, at least `per_thread` elements per thread, 4 to
    16 warps."""
    block_n = row_block(n_cols, op)
    block_m = max(1, tile // block_n)
    return block_m, block_n, min(16, max(4, block_m * block_n // (32 * per_thread)))


@triton.jit
def _rms_norm_fwd_kernel(
    X, R, W, Y, H, RSTD,
    stride_x, stride_r, stride_y, stride_h,
    M, N, eps,
    HAS_RESIDUAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    row_ids = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    mask = (row_ids < M)[:, None] & (cols < N)[None, :]
    rows = row_ids.to(tl.int64)[:, None]  # row * stride may pass 2**31
    w = tl.load(W + cols, mask=cols < N, other=0.0).to(tl.float32)  # issued before the reduction
    x = tl.load(X + rows * stride_x + cols[None, :], mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(R + rows * stride_r + cols[None, :], mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(X.dtype.element_ty)  # h = x + residual
        tl.store(H + rows * stride_h + cols[None, :], x, mask=mask)
    xf = x.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(xf * xf, axis=1) / N + eps)  # (BLOCK_M,)
    normed = (xf * rstd[:, None]).to(X.dtype.element_ty).to(tl.float32)  # rounded, as HF does
    y = (normed * w[None, :]).to(Y.dtype.element_ty, fp_downcast_rounding="rtne")  # as torch
    tl.store(Y + rows * stride_y + cols[None, :], y, mask=mask)
    tl.store(RSTD + row_ids, rstd, mask=row_ids < M)


@triton.jit
def _rms_norm_bwd_kernel(
    DY, X, W, RSTD, DH, DX, DW_PARTIAL,
    stride_dy, stride_x, stride_dh, stride_dx,
    M, N,
    HAS_DH: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    # persistent: program p handles row tiles p, p + P, ... and keeps one dw partial sum
    pid = tl.program_id(0)
    n_programs = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32)
    dw_acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    # software pipeline: tile t + P is loaded before tile t is reduced and stored
    rows = (pid * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    mask = (rows < M)[:, None] & col_mask[None, :]
    dy_next = tl.load(DY + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0)
    x_next = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
    rstd_next = tl.load(RSTD + rows, mask=rows < M, other=0.0)
    for tile in range(pid, tl.cdiv(M, BLOCK_M), n_programs):
        dy, x, rstd, cur_rows, cur_mask = dy_next, x_next, rstd_next, rows, mask
        rows = ((tile + n_programs) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        mask = (rows < M)[:, None] & col_mask[None, :]
        dy_next = tl.load(DY + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0)
        x_next = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
        rstd_next = tl.load(RSTD + rows, mask=rows < M, other=0.0)

        dy = dy.to(tl.float32)
        n_hat = x.to(tl.float32) * rstd[:, None]
        dw_acc += tl.sum(dy * n_hat.to(X.dtype.element_ty).to(tl.float32), axis=0)
        dn = dy * w[None, :]
        # d/dx of x * rstd(x): rstd * (dn - n_hat * mean(dn * n_hat))
        dx = rstd[:, None] * (dn - n_hat * (tl.sum(dn * n_hat, axis=1) / N)[:, None])
        if HAS_DH:
            dh = tl.load(
                DH + cur_rows[:, None] * stride_dh + cols[None, :], mask=cur_mask, other=0.0
            )
            dx += dh.to(tl.float32)
        tl.store(DX + cur_rows[:, None] * stride_dx + cols[None, :], dx.to(DX.dtype.element_ty),
                 mask=cur_mask)  # fmt: skip
    tl.store(DW_PARTIAL + pid * N + cols, dw_acc, mask=col_mask)


def _as_rows(t: torch.Tensor) -> torch.Tensor:
    """(..., N) -> (M, N) with unit column stride (a view when the layout allows)."""
    rows = t.reshape(-1, t.shape[-1])  # (M, N)
    return rows if rows.stride(-1) == 1 else rows.contiguous()


def _check(x: torch.Tensor, weight: torch.Tensor, op: str, out_dtype: torch.dtype | None) -> None:
    for name, dtype in (("x.dtype", x.dtype), ("out_dtype", out_dtype or x.dtype)):
        if dtype not in _IO_DTYPES:
            raise TypeError(f"{op}: {name} = {dtype}; the Triton kernel supports {_IO_DTYPES}")
    if weight.shape != (x.shape[-1],):
        raise ValueError(f"{op}: weight shape {tuple(weight.shape)} != ({x.shape[-1]},)")


def _forward(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    out_dtype: torch.dtype | None,
):
    x2 = _as_rows(x)
    weight = weight.contiguous()
    M, N = x2.shape
    block_m, block_n, warps = _tile(N, FWD_TILE, 32, "rms_norm")
    out_dtype = out_dtype or torch.promote_types(x.dtype, weight.dtype)
    y = torch.empty((M, N), device=x.device, dtype=out_dtype)
    rstd = torch.empty((M,), device=x.device, dtype=torch.float32)
    if residual is not None:
        r2 = _as_rows(residual)
        h = torch.empty_like(x2)
    else:
        r2 = h = x2  # r2 unused by the kernel; h is x's rows
    _rms_norm_fwd_kernel[(triton.cdiv(M, block_m),)](
        x2, r2, weight, y, h, rstd,
        x2.stride(0), r2.stride(0), y.stride(0), h.stride(0),
        M, N, eps,
        HAS_RESIDUAL=residual is not None, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps,
    )  # fmt: skip
    return y, h, rstd  # h: the normalized input rows (x + residual, or x)


def _backward(dy: torch.Tensor, x2: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor, dh):
    M, N = x2.shape
    weight = weight.contiguous()
    dy2 = _as_rows(dy)
    dh2 = _as_rows(dh) if dh is not None else dy2
    block_m, block_n, warps = _tile(N, BWD_TILE, 16, "rms_norm backward")
    # every program resident at once: 128 registers x 16 warps x 32 threads fill the 64K register
    # file exactly (bf16 needs 126; fp32 would take 136 and spill 24 bytes when capped)
    per_sm = 16 // warps
    n_tiles = triton.cdiv(M, block_m)
    n_programs = max(1, min(n_tiles, n_persistent_programs(x2.device, per_sm=per_sm)))
    dx = torch.empty_like(x2)
    dw_partial = torch.empty((n_programs, N), device=x2.device, dtype=torch.float32)
    _rms_norm_bwd_kernel[(n_programs,)](
        dy2, x2, weight, rstd, dh2, dx, dw_partial,
        dy2.stride(0), x2.stride(0), dh2.stride(0), dx.stride(0),
        M, N,
        HAS_DH=dh is not None, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps, maxnreg=128,
    )  # fmt: skip
    return dx, dw_partial.sum(0).to(weight.dtype)


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float, out_dtype) -> torch.Tensor:
        y, x2, rstd = _forward(x, None, weight, eps, out_dtype)
        ctx.save_for_backward(x2, weight, rstd)
        ctx.x_shape = x.shape
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x2, weight, rstd = ctx.saved_tensors
        dx, dw = _backward(dy, x2, weight, rstd, None)
        return dx.view(ctx.x_shape), dw, None, None


class _RMSNormResidual(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, residual, weight, eps: float, out_dtype):
        y, h, rstd = _forward(x, residual, weight, eps, out_dtype)
        ctx.save_for_backward(h, weight, rstd)
        ctx.x_shape, ctx.residual_dtype = x.shape, residual.dtype
        return y.view(x.shape), h.view(x.shape)

    @staticmethod
    def backward(ctx, dy: torch.Tensor, dh: torch.Tensor):
        h, weight, rstd = ctx.saved_tensors
        dx, dw = _backward(dy, h, weight, rstd, dh)
        dx = dx.view(ctx.x_shape)
        return dx, dx.to(ctx.residual_dtype), dw, None, None  # h = x + residual: both get dh


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, out_dtype: torch.dtype | None = None
) -> torch.Tensor:
    """Same result as ref_rms_norm(x, weight, eps, out_dtype); x (..., C) in fp32/fp16/bf16."""
    _check(x, weight, "rms_norm", out_dtype)
    return _RMSNorm.apply(x, weight, eps, out_dtype)


def rms_norm_residual(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    out_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """h = x + residual (in x.dtype); returns (ref_rms_norm(h, weight, eps, out_dtype), h) in one
    pass. residual may be of a lower precision that promotes to x.dtype (torch's x + residual)."""
    _check(x, weight, "rms_norm_residual", out_dtype)
    if residual.shape != x.shape or torch.promote_types(x.dtype, residual.dtype) != x.dtype:
        raise ValueError(
            f"rms_norm_residual: residual {tuple(residual.shape)} {residual.dtype} must have "
            f"x's shape {tuple(x.shape)} and a dtype that promotes to x's {x.dtype}"
        )
    return _RMSNormResidual.apply(x, residual, weight, eps, out_dtype)
