"""Grouped GEMMs over expert-sorted rows: torch._grouped_mm where it runs, a Triton kernel otherwise.

Two products, with `offs` the int32 cumulative row ends of the E groups (torch._grouped_mm's
convention):
  gmm(a (M, K), b (E, K, N), offs) -> (M, N): rows of group e times b[e]
  gmm_wgrad(a (M, P), b (M, Q), offs) -> (E, P, Q): a_e.T @ b_e, the weight gradient
The Triton forward kernel walks a tile table (tiles per group, cumulated on device) so the launch
needs no host sync: grid = cdiv(M, BM) + E row tiles, surplus programs exit at once.
"""

import torch
import triton
import triton.language as tl

from ats_kernels.triton.launch import interpreting

BM, BN, BK = 64, 64, 32


@triton.jit
def _gmm_kernel(
    A, B, OUT, OFFS, TILE_END,
    N, K, E,
    sam, sak, sbe, sbk, sbn, som, son,
    FP32_IEEE: tl.constexpr, BLOCK_E: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    experts = tl.arange(0, BLOCK_E)
    tile_end = tl.load(TILE_END + experts, mask=experts < E, other=2**30)  # cumulative tiles
    e = tl.sum((tile_end <= pid_m).to(tl.int32), axis=0)  # group owning this row tile
    if e >= E:
        return
    tiles_before = tl.load(TILE_END + e - 1, mask=e > 0, other=0)
    row_start = tl.load(OFFS + e - 1, mask=e > 0, other=0)
    row_end = tl.load(OFFS + e)
    rows = row_start + (pid_m - tiles_before) * BM + tl.arange(0, BM)
    cols = pid_n * BN + tl.arange(0, BN)
    r_mask = rows < row_end
    c_mask = cols < N
    rows64 = rows.to(tl.int64)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    b_base = B + e.to(tl.int64) * sbe
    for k0 in range(0, K, BK):
        ks = k0 + tl.arange(0, BK)
        k_mask = ks < K
        a = tl.load(
            A + rows64[:, None] * sam + ks[None, :] * sak,
            mask=r_mask[:, None] & k_mask[None, :],
            other=0.0,
        )
        b = tl.load(
            b_base + ks[:, None] * sbk + cols[None, :] * sbn,
            mask=k_mask[:, None] & c_mask[None, :],
            other=0.0,
        )
        if FP32_IEEE:  # fp32 operands (or the interpreter's upcast ones): no TF32 rounding
            acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
    out = OUT + rows64[:, None] * som + cols[None, :] * son
    tl.store(out, acc.to(OUT.dtype.element_ty), mask=r_mask[:, None] & c_mask[None, :])


@triton.jit
def _gmm_wgrad_kernel(
    A, B, OUT, OFFS,
    P, Q,
    sam, sap, sbm, sbq, soe, sop, soq,
    FP32_IEEE: tl.constexpr, BP: tl.constexpr, BQ: tl.constexpr, BK: tl.constexpr,
):  # fmt: skip
    e = tl.program_id(0)
    ps = tl.program_id(1) * BP + tl.arange(0, BP)
    qs = tl.program_id(2) * BQ + tl.arange(0, BQ)
    p_mask = ps < P
    q_mask = qs < Q
    row_start = tl.load(OFFS + e - 1, mask=e > 0, other=0)
    row_end = tl.load(OFFS + e)
    acc = tl.zeros((BP, BQ), dtype=tl.float32)
    for m0 in range(row_start, row_end, BK):
        ms = m0 + tl.arange(0, BK)
        m_mask = ms < row_end
        ms64 = ms.to(tl.int64)
        a_t = tl.load(
            A + ms64[None, :] * sam + ps[:, None] * sap,
            mask=p_mask[:, None] & m_mask[None, :],
            other=0.0,
        )
        b = tl.load(
            B + ms64[:, None] * sbm + qs[None, :] * sbq,
            mask=m_mask[:, None] & q_mask[None, :],
            other=0.0,
        )
        if FP32_IEEE:
            acc = tl.dot(a_t.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(a_t, b, acc)
    out = OUT + e.to(tl.int64) * soe + ps[:, None] * sop + qs[None, :] * soq
    tl.store(out, acc.to(OUT.dtype.element_ty), mask=p_mask[:, None] & q_mask[None, :])


def _fp32_dot(a: torch.Tensor) -> bool:
    """fp32 math in tl.dot: for fp32 inputs, and under TRITON_INTERPRET=1, whose tl.dot (triton 3.9)
    multiplies the raw uint16 bits of bf16 operands; the upcast there keeps CPU tests meaningful."""
    return a.dtype == torch.float32 or interpreting()


def torch_grouped_mm_usable(t: torch.Tensor) -> bool:
    """torch._grouped_mm's fast path: present in this torch, CUDA sm_90+, bf16."""
    if not hasattr(torch, "_grouped_mm") or not t.is_cuda or t.dtype != torch.bfloat16:
        return False
    return torch.cuda.get_device_capability(t.device) >= (9, 0)


def _triton_gmm(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    M, K = a.shape
    E, _, N = b.shape
    out = torch.empty((M, N), device=a.device, dtype=a.dtype)
    if M == 0 or N == 0:
        return out
    counts = torch.diff(offs, prepend=offs.new_zeros(1))  # (E,)
    tile_end = torch.cumsum((counts + BM - 1) // BM, 0).to(torch.int32)  # (E,) row tiles so far
    grid = (triton.cdiv(M, BM) + E, triton.cdiv(N, BN))
    _gmm_kernel[grid](
        a, b, out, offs, tile_end,
        N, K, E,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), b.stride(2), out.stride(0), out.stride(1),
        FP32_IEEE=_fp32_dot(a), BLOCK_E=triton.next_power_of_2(E),
        BM=BM, BN=BN, BK=BK, num_warps=4,
    )  # fmt: skip
    return out


def _triton_gmm_wgrad(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    _, P = a.shape
    _, Q = b.shape
    E = offs.numel()
    out = torch.empty((E, P, Q), device=a.device, dtype=a.dtype)
    if out.numel() == 0:
        return out
    grid = (E, triton.cdiv(P, BM), triton.cdiv(Q, BN))
    _gmm_wgrad_kernel[grid](
        a, b, out, offs,
        P, Q,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0), out.stride(1), out.stride(2),
        FP32_IEEE=_fp32_dot(a), BP=BM, BQ=BN, BK=BK, num_warps=4,
    )  # fmt: skip
    return out


def gmm(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, use_torch: bool) -> torch.Tensor:
    """a (M, K) grouped by offs, b (E, K, N) any strides -> (M, N)."""
    if use_torch:
        return torch._grouped_mm(a, b, offs=offs)
    return _triton_gmm(a, b, offs)


def gmm_wgrad(
    a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, use_torch: bool
) -> torch.Tensor:
    """a (M, P), b (M, Q) grouped by offs -> (E, P, Q), group e = a_e.T @ b_e (zeros if empty)."""
    if use_torch:
        return torch._grouped_mm(a.T, b, offs=offs)
    return _triton_gmm_wgrad(a, b, offs)
