"""04_pipelined: 03 with the backward's row loads pipelined by Triton (tl.range num_stages=3:
cp.async into shared memory, two rows in flight ahead of the one being reduced), and dw summed by
a second Triton pass that writes the weight dtype (replaces torch's sum(0) + .to(): one launch).

Why: 01/02/03 all measured bwd 0.33-0.36 ms (1.2 TB/s): one row (16 KiB of dy + x) in flight per
program, 2-3 programs per SM = 32-48 KiB per SM, while a 4.2 TB/s stream at ~1-2 us loaded latency
needs ~32-64 KiB per SM continuously, and each program idles during its reduction and store.
sm_90 compile (triton 3.9): 115 registers x 256 threads (maxnreg 128 keeps 2 per SM resident),
32 KiB shared per program (2 stages of dy + x); 64 KiB of loads in flight per SM at all times.
PREDICTION (16384x4096 bf16), if the graph column shows the kernels (not the host) dominate:
bwd ~0.11 ms (384 MiB at ~3.6 TB/s), fwd+bwd GPU ~0.19 ms (~83% of copy); dw pass ~5 us.
"""

import torch
import triton
import triton.language as tl
from ats_kernels.triton.launch import n_persistent_programs, row_block

_IO_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
FWD_TILE = 8192  # elements per forward program (2 rows of 4096): more loads in flight per barrier
BWD_TILE = 4096  # elements per backward iteration (one row of 4096)
SMEM_BUDGET = 96 * 1024  # bytes of pipeline buffers per backward program (2 per SM of 228 KiB)
DW_BLOCK_N = 128  # columns per dw-reduction program: N / 128 programs, 32 x 128 fp32 per step


def _tile(n_cols: int, tile: int, op: str) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps): whole rows, ~16 elements per thread, at most 16 warps."""
    block_n = row_block(n_cols, op)
    block_m = max(1, tile // block_n)
    return block_m, block_n, min(16, max(4, block_m * block_n // 512))


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
    tl.store(Y + rows * stride_y + cols[None, :], (normed * w[None, :]).to(Y.dtype.element_ty),
             mask=mask)  # fmt: skip
    tl.store(RSTD + row_ids, rstd, mask=row_ids < M)


@triton.jit
def _rms_norm_bwd_kernel(
    DY, X, W, RSTD, DH, DX, DW_PARTIAL,
    stride_dy, stride_x, stride_dh, stride_dx,
    M, N,
    HAS_DH: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STAGES: tl.constexpr,
):  # fmt: skip
    # persistent: program p handles row tiles p, p + P, ... and keeps one dw partial sum
    pid = tl.program_id(0)
    n_programs = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32)
    dw_acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    # STAGES=3: Triton issues the loads of tiles t + P and t + 2P (cp.async to shared memory)
    # before tile t is reduced, so loads stay in flight through the reduction and the store
    for tile in tl.range(pid, tl.cdiv(M, BLOCK_M), n_programs, num_stages=STAGES):
        cur_rows = (tile * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        cur_mask = (cur_rows < M)[:, None] & col_mask[None, :]
        dy = tl.load(DY + cur_rows[:, None] * stride_dy + cols[None, :], mask=cur_mask, other=0.0)
        x = tl.load(X + cur_rows[:, None] * stride_x + cols[None, :], mask=cur_mask, other=0.0)
        rstd = tl.load(RSTD + cur_rows, mask=cur_rows < M, other=0.0)
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


@triton.jit
def _dw_reduce_kernel(
    DW_PARTIAL, DW, P, N, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr
):  # fmt: skip
    # dw[cols] = sum over the P partial rows, written in the weight dtype (no fp32 round trip)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_P, BLOCK_N), dtype=tl.float32)
    for p0 in range(0, P, BLOCK_P):
        p = p0 + tl.arange(0, BLOCK_P)
        mask = (p < P)[:, None] & (cols < N)[None, :]
        acc += tl.load(DW_PARTIAL + p[:, None] * N + cols[None, :], mask=mask, other=0.0)
    tl.store(DW + cols, tl.sum(acc, axis=0).to(DW.dtype.element_ty), mask=cols < N)


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
    block_m, block_n, warps = _tile(N, FWD_TILE, "rms_norm")
    out_dtype = torch.promote_types(x.dtype, weight.dtype)
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
    block_m, block_n, warps = _tile(N, BWD_TILE, "rms_norm backward")
    # every program resident at once: <= 128 registers x 256 threads x 2 fill the 64K register
    # file (115 used on sm_90), 2 x 32 KiB of pipeline buffers fit the 228 KiB of shared memory
    per_sm = 2 if warps <= 8 else 1
    # (STAGES - 1) tiles of dy, x (and dh) sit in shared memory: keep them under ~96 KiB
    tile_bytes = block_m * block_n * (dy2.element_size() + x2.element_size()
                                      + (dh2.element_size() if dh is not None else 0))  # fmt: skip
    stages = 3 if 2 * tile_bytes <= SMEM_BUDGET else 2 if tile_bytes <= SMEM_BUDGET else 1
    n_tiles = triton.cdiv(M, block_m)
    n_programs = max(1, min(n_tiles, n_persistent_programs(x2.device, per_sm=per_sm)))
    dx = torch.empty_like(x2)
    dw_partial = torch.empty((n_programs, N), device=x2.device, dtype=torch.float32)
    _rms_norm_bwd_kernel[(n_programs,)](
        dy2, x2, weight, rstd, dh2, dx, dw_partial,
        dy2.stride(0), x2.stride(0), dh2.stride(0), dx.stride(0),
        M, N,
        HAS_DH=dh is not None, BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages, num_warps=warps,
        maxnreg=128,
    )  # fmt: skip
    dw = torch.empty_like(weight)
    _dw_reduce_kernel[(triton.cdiv(N, DW_BLOCK_N),)](
        dw_partial, dw, n_programs, N, BLOCK_P=32, BLOCK_N=DW_BLOCK_N, num_warps=4
    )
    return dx, dw


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
