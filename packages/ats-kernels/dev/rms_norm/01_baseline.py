"""01_baseline: the production RMSNorm before the H200 tuning (issue 5), kept for the ladder.

Measured on the H200 (16384x4096 bf16, fwd+bwd): 0.697 ms, 23% of copy bandwidth. Diagnosis: the
backward kernel uses 80 registers x 256 threads, so 3 programs fit per SM but 4 per SM are launched:
a quarter of the persistent grid runs as a second wave at 1 program per SM; inside each program
load -> row reduction -> store never overlap; the forward loads the weight after the reduction.
"""

import torch
import triton
import triton.language as tl
from ats_kernels.triton.launch import n_persistent_programs, row_block


def warps_for(block: int) -> int:
    """More warps for wider rows, so each thread holds at most ~16 elements."""
    return 16 if block >= 16384 else 8 if block >= 4096 else 4 if block >= 1024 else 2


_IO_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def _rms_norm_fwd_kernel(
    X, R, W, Y, H, RSTD,
    stride_x, stride_r, stride_y, stride_h,
    N, eps,
    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(R + row * stride_r + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(X.dtype.element_ty)  # h = x + residual
        tl.store(H + row * stride_h + cols, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(xf * xf, axis=0) / N + eps)
    normed = (xf * rstd).to(X.dtype.element_ty).to(tl.float32)  # rounded to x.dtype, as HF does
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + row * stride_y + cols, (normed * w).to(Y.dtype.element_ty), mask=mask)
    tl.store(RSTD + row, rstd)


@triton.jit
def _rms_norm_bwd_kernel(
    DY, X, W, RSTD, DH, DX, DW_PARTIAL,
    stride_dy, stride_x, stride_dh, stride_dx,
    M, N,
    HAS_DH: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    # persistent: program p handles rows p, p + P, ... and keeps one dw partial sum
    pid = tl.program_id(0).to(tl.int64)  # int64 loop variable: row * stride may pass 2**31
    n_programs = tl.num_programs(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    dw_acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for row in range(pid, M, n_programs):
        dy = tl.load(DY + row * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
        x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + row)
        n_hat = x * rstd
        dw_acc += dy * n_hat.to(X.dtype.element_ty).to(tl.float32)
        dn = dy * w
        # d/dx of x * rstd(x): rstd * (dn - n_hat * mean(dn * n_hat))
        dx = rstd * (dn - n_hat * (tl.sum(dn * n_hat, axis=0) / N))
        if HAS_DH:
            dx += tl.load(DH + row * stride_dh + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(DX + row * stride_dx + cols, dx.to(DX.dtype.element_ty), mask=mask)
    tl.store(DW_PARTIAL + pid * N + cols, dw_acc, mask=mask)


def _as_rows(t: torch.Tensor) -> torch.Tensor:
    """(..., N) -> (M, N) with unit column stride (a view when the layout allows)."""
    rows = t.reshape(-1, t.shape[-1])  # (M, N)
    return rows if rows.stride(-1) == 1 else rows.contiguous()


def _check(x: torch.Tensor, weight: torch.Tensor, op: str) -> None:
    if x.dtype not in _IO_DTYPES:
        raise TypeError(f"{op}: x.dtype = {x.dtype}; the Triton kernel supports {_IO_DTYPES}")
    if weight.shape != (x.shape[-1],):
        raise ValueError(f"{op}: weight shape {tuple(weight.shape)} != ({x.shape[-1]},)")


def _forward(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float):
    x2 = _as_rows(x)
    weight = weight.contiguous()
    M, N = x2.shape
    block = row_block(N, "rms_norm")
    out_dtype = torch.promote_types(x.dtype, weight.dtype)
    y = torch.empty((M, N), device=x.device, dtype=out_dtype)
    rstd = torch.empty((M,), device=x.device, dtype=torch.float32)
    if residual is not None:
        r2 = _as_rows(residual)
        h = torch.empty_like(x2)
    else:
        r2 = h = x2  # r2 unused by the kernel; h is x's rows
    _rms_norm_fwd_kernel[(M,)](
        x2, r2, weight, y, h, rstd,
        x2.stride(0), r2.stride(0), y.stride(0), h.stride(0),
        N, eps,
        HAS_RESIDUAL=residual is not None, BLOCK=block, num_warps=warps_for(block),
    )  # fmt: skip
    return y, h, rstd  # h: the normalized input rows (x + residual, or x)


def _backward(dy: torch.Tensor, x2: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor, dh):
    M, N = x2.shape
    weight = weight.contiguous()
    dy2 = _as_rows(dy)
    dh2 = _as_rows(dh) if dh is not None else dy2
    block = row_block(N, "rms_norm backward")
    n_programs = max(1, min(M, n_persistent_programs(x2.device, per_sm=4)))
    dx = torch.empty_like(x2)
    dw_partial = torch.empty((n_programs, N), device=x2.device, dtype=torch.float32)
    _rms_norm_bwd_kernel[(n_programs,)](
        dy2, x2, weight, rstd, dh2, dx, dw_partial,
        dy2.stride(0), x2.stride(0), dh2.stride(0), dx.stride(0),
        M, N,
        HAS_DH=dh is not None, BLOCK=block, num_warps=warps_for(block),
    )  # fmt: skip
    return dx, dw_partial.sum(0).to(weight.dtype)


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        y, x2, rstd = _forward(x, None, weight, eps)
        ctx.save_for_backward(x2, weight, rstd)
        ctx.x_shape = x.shape
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x2, weight, rstd = ctx.saved_tensors
        dx, dw = _backward(dy, x2, weight, rstd, None)
        return dx.view(ctx.x_shape), dw, None


class _RMSNormResidual(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
        y, h, rstd = _forward(x, residual, weight, eps)
        ctx.save_for_backward(h, weight, rstd)
        ctx.x_shape = x.shape
        return y.view(x.shape), h.view(x.shape)

    @staticmethod
    def backward(ctx, dy: torch.Tensor, dh: torch.Tensor):
        h, weight, rstd = ctx.saved_tensors
        dx, dw = _backward(dy, h, weight, rstd, dh)
        dx = dx.view(ctx.x_shape)
        return dx, dx, dw, None  # h = x + residual: both get dh


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Same result as ref_rms_norm(x, weight, eps); x (..., C) in fp32/fp16/bf16."""
    _check(x, weight, "rms_norm")
    return _RMSNorm.apply(x, weight, eps)


def rms_norm_residual(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """h = x + residual (in x.dtype); returns (ref_rms_norm(h, weight, eps), h) in one pass."""
    _check(x, weight, "rms_norm_residual")
    if residual.shape != x.shape or residual.dtype != x.dtype:
        raise ValueError(
            f"rms_norm_residual: residual {tuple(residual.shape)} {residual.dtype} must match "
            f"x {tuple(x.shape)} {x.dtype}"
        )
    return _RMSNormResidual.apply(x, residual, weight, eps)
