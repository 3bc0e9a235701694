"""Triton SwiGLU, silu(gate) * up, forward + backward in fp32 registers.

gate/up may be row-strided views (e.g. the two halves of one fused w13 projection); the kernel
reads them in place, one (rows x columns) tile of 4096 elements per program. Backward recomputes
sigmoid(gate) instead of storing it. Tuning history and its ladder: packages/ats-kernels/dev/swiglu/.
"""

import torch
import triton
import triton.language as tl

_IO_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
TILE = 4096  # elements per program: 32 per thread at 4 warps (dev/swiglu/03 won on the H200)
WARPS = 4


def _tile(M: int, N: int) -> tuple[tuple[int, int], int, int]:
    """(grid, BLOCK_M, BLOCK_N) covering (M, N) with tiles of TILE elements."""
    block_n = min(triton.next_power_of_2(N), TILE)
    block_m = TILE // block_n
    return (triton.cdiv(M, block_m), triton.cdiv(N, block_n)), block_m, block_n


@triton.jit
def _sigmoid(g):
    # approximate fp32 division (div.full, 2 ulp): tl.sigmoid's IEEE division costs ~10 instructions
    return tl.math.fdiv(tl.full(g.shape, 1.0, tl.float32), 1.0 + tl.exp(-g), ieee_rounding=False)


@triton.jit
def _tile_offsets(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """(row offsets (BLOCK_M, 1) as int64, columns (1, BLOCK_N), mask) of this program's tile."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    return rows.to(tl.int64)[:, None], cols[None, :], mask


@triton.jit
def _swiglu_grads(dy, g, u):
    """(d gate, d up) in fp32 of silu(g) * u for the output gradient dy."""
    sig = _sigmoid(g)
    silu = g * sig
    dg = dy * u * sig * (1.0 + g * (1.0 - sig))  # d silu / dg = sig * (1 + g * (1 - sig))
    return dg, dy * silu


@triton.jit
def _swiglu_fwd_kernel(
    G, U, Y, stride_g, stride_u, stride_y, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr
):
    rows, cols, mask = _tile_offsets(M, N, BLOCK_M, BLOCK_N)
    g = tl.load(G + rows * stride_g + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(U + rows * stride_u + cols, mask=mask, other=0.0).to(tl.float32)
    y = g * _sigmoid(g) * u
    tl.store(Y + rows * stride_y + cols, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _swiglu_bwd_kernel(
    DY, G, U, DG, DU,
    stride_dy, stride_g, stride_u, stride_dg, stride_du,
    M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    rows, cols, mask = _tile_offsets(M, N, BLOCK_M, BLOCK_N)
    dy = tl.load(DY + rows * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(G + rows * stride_g + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(U + rows * stride_u + cols, mask=mask, other=0.0).to(tl.float32)
    dg, du = _swiglu_grads(dy, g, u)
    tl.store(DG + rows * stride_dg + cols, dg.to(DG.dtype.element_ty), mask=mask)
    tl.store(DU + rows * stride_du + cols, du.to(DU.dtype.element_ty), mask=mask)


@triton.jit
def _swiglu_packed_fwd_kernel(
    GU, Y, stride_gu, stride_y, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr
):
    """GU (M, 2N) = [gate | up]: each tensor is one argument (see _SwiGLUPacked)."""
    rows, cols, mask = _tile_offsets(M, N, BLOCK_M, BLOCK_N)
    g = tl.load(GU + rows * stride_gu + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(GU + rows * stride_gu + N + cols, mask=mask, other=0.0).to(tl.float32)
    y = g * _sigmoid(g) * u
    tl.store(Y + rows * stride_y + cols, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _swiglu_packed_bwd_kernel(
    DY, GU, DGU, stride_dy, stride_gu, stride_dgu, M, N,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    rows, cols, mask = _tile_offsets(M, N, BLOCK_M, BLOCK_N)
    dy = tl.load(DY + rows * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(GU + rows * stride_gu + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(GU + rows * stride_gu + N + cols, mask=mask, other=0.0).to(tl.float32)
    dg, du = _swiglu_grads(dy, g, u)
    tl.store(DGU + rows * stride_dgu + cols, dg.to(DGU.dtype.element_ty), mask=mask)
    tl.store(DGU + rows * stride_dgu + N + cols, du.to(DGU.dtype.element_ty), mask=mask)


def _as_rows(t: torch.Tensor) -> torch.Tensor:
    rows = t.reshape(-1, t.shape[-1])  # (M, N), a view for row-strided inputs
    return rows if rows.stride(-1) == 1 else rows.contiguous()


def swiglu_forward(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up without autograd; gate/up (..., N) with the same shape."""
    g2, u2 = _as_rows(gate), _as_rows(up)
    M, N = g2.shape
    y = torch.empty((M, N), device=gate.device, dtype=gate.dtype)
    if y.numel() > 0:
        grid, block_m, block_n = _tile(M, N)
        _swiglu_fwd_kernel[grid](
            g2, u2, y, g2.stride(0), u2.stride(0), y.stride(0), M, N,
            BLOCK_M=block_m, BLOCK_N=block_n, num_warps=WARPS,
        )  # fmt: skip
    return y.view(gate.shape)


def swiglu_backward(
    dy: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, out: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(d gate, d up) of silu(gate) * up for the output gradient dy, without autograd.
    out (M, 2N): write d gate into its first N columns and d up into the rest (the gradient of
    one fused gate|up projection) and return those two views."""
    dy2, g2, u2 = _as_rows(dy), _as_rows(gate), _as_rows(up)
    M, N = g2.shape
    if out is None:
        dg = torch.empty((M, N), device=g2.device, dtype=g2.dtype)
        du = torch.empty((M, N), device=u2.device, dtype=u2.dtype)
    elif out.shape != (M, 2 * N) or out.stride(-1) != 1:
        raise ValueError(f"swiglu_backward: out {tuple(out.shape)} must be ({M}, {2 * N}), rows")
    else:
        dg, du = out[:, :N], out[:, N:]
    if dg.numel() > 0:
        grid, block_m, block_n = _tile(M, N)
        _swiglu_bwd_kernel[grid](
            dy2, g2, u2, dg, du,
            dy2.stride(0), g2.stride(0), u2.stride(0), dg.stride(0), du.stride(0),
            M, N, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=WARPS,
        )  # fmt: skip
    return dg.view(gate.shape), du.view(gate.shape)


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(gate, up)
        return swiglu_forward(gate, up)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        gate, up = ctx.saved_tensors
        return swiglu_backward(dy, gate, up)


class _SwiGLUPacked(torch.autograd.Function):
    """The gradient comes back as one (..., 2N) tensor, written by one kernel: split halves would
    cost autograd a concatenation pass. The kernels take each (M, 2N) tensor whole, once, and
    find the up half at column N themselves: under torch.compile, a kernel writing into views of
    a buffer, or given one buffer as two written arguments, is functionalized into clones of the
    buffer and copies back (each a full pass, seen in H200 profiles)."""

    @staticmethod
    def forward(ctx, gate_up: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(gate_up)
        gu = gate_up.reshape(-1, gate_up.shape[-1])  # (M, 2N)
        M, N = gu.shape[0], gu.shape[1] // 2
        y = torch.empty((M, N), device=gu.device, dtype=gu.dtype)
        if y.numel() > 0:
            grid, block_m, block_n = _tile(M, N)
            _swiglu_packed_fwd_kernel[grid](
                gu, y, gu.stride(0), y.stride(0), M, N,
                BLOCK_M=block_m, BLOCK_N=block_n, num_warps=WARPS,
            )  # fmt: skip
        return y.view(*gate_up.shape[:-1], N)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        (gate_up,) = ctx.saved_tensors
        gu = gate_up.reshape(-1, gate_up.shape[-1])  # (M, 2N)
        M, N = gu.shape[0], gu.shape[1] // 2
        dy2 = _as_rows(dy)
        grad = torch.empty((M, 2 * N), device=gu.device, dtype=gu.dtype)
        if grad.numel() > 0:
            grid, block_m, block_n = _tile(M, N)
            _swiglu_packed_bwd_kernel[grid](
                dy2, gu, grad, dy2.stride(0), gu.stride(0), grad.stride(0), M, N,
                BLOCK_M=block_m, BLOCK_N=block_n, num_warps=WARPS,
            )  # fmt: skip
        return grad.view(gate_up.shape)


def swiglu_packed(gate_up: torch.Tensor) -> torch.Tensor:
    """Same result as ref_swiglu_packed: gate_up (..., 2N) = [gate | up] -> silu(gate) * up."""
    if gate_up.shape[-1] % 2:
        raise ValueError(f"swiglu_packed: last dim {gate_up.shape[-1]} of gate_up must be even")
    if gate_up.dtype not in _IO_DTYPES:
        raise TypeError(
            f"swiglu_packed: dtype {gate_up.dtype}; the Triton kernel supports {_IO_DTYPES}"
        )
    return _SwiGLUPacked.apply(gate_up.contiguous())


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """Same result as ref_swiglu: silu(gate) * up for same-shape, same-dtype gate and up."""
    if gate.shape != up.shape or gate.dtype != up.dtype:
        raise ValueError(
            f"swiglu: gate {tuple(gate.shape)} {gate.dtype} and up {tuple(up.shape)} {up.dtype} must match"
        )
    if gate.dtype not in _IO_DTYPES:
        raise TypeError(f"swiglu: dtype {gate.dtype}; the Triton kernel supports {_IO_DTYPES}")
    return _SwiGLU.apply(gate, up)
