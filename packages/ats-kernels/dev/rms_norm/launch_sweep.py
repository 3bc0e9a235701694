"""RMSNorm launch-shape sweep (issue 5): the production forward kernel at several (rows per
program, warps), the production backward kernel over (rows per tile, warps, persistent programs
per SM, register cap), and the production backward as launched, timed by CUDA-graph replay of the
bare kernels, at the 124M model's rows (32768 x 768, bf16 and fp32 residual stream) and at
16384 x 4096 bf16.

FWD_TILE / BWD_TILE / programs per SM in src/ats_kernels/triton/rms_norm.py were picked from these
numbers (docs/benchmarks-journal-2026.md, the RMSNorm end-to-end runs). One JSON line per case: op, width, dtype,
tile, ms, GB/s of the bytes that must move.

GPU: PYTHONPATH=packages/ats-kernels/src python3 packages/ats-kernels/dev/rms_norm/launch_sweep.py
"""

import importlib
import json

import torch
import triton
from triton.testing import do_bench_cudagraph

rn = importlib.import_module("ats_kernels.triton.rms_norm")
SHAPES = ((32768, 768, torch.bfloat16), (32768, 768, torch.float32), (16384, 4096, torch.bfloat16))
FWD_TILES = ((8, 16), (1, 2), (1, 4), (2, 4), (2, 8), (4, 4), (4, 8), (8, 8))  # (rows, warps)
BWD_GRID = [  # (rows, warps, programs per SM, register cap)
    (rows, warps, per_sm, maxnreg)
    for rows in (1, 2, 4, 8)
    for warps in (4, 8, 16)
    for per_sm in (1, 2, 4, 8)
    for maxnreg in (None, 128)
]


def forward_ms(M: int, N: int, dtype: torch.dtype, rows: int, warps: int, residual: bool):
    """The forward kernel writing bf16 (as under autocast), optionally adding a bf16 residual."""
    dev = torch.device("cuda")
    x = torch.randn(M, N, device=dev, dtype=dtype)
    r = torch.randn(M, N, device=dev, dtype=torch.bfloat16)
    w = torch.randn(N, device=dev)
    y = torch.empty(M, N, device=dev, dtype=torch.bfloat16)
    h = torch.empty_like(x)
    rstd = torch.empty(M, device=dev)

    def launch() -> None:
        rn._rms_norm_fwd_kernel[(triton.cdiv(M, rows),)](
            x, r, w, y, h, rstd, x.stride(0), r.stride(0), y.stride(0), h.stride(0), M, N, 1e-5,
            HAS_RESIDUAL=residual, BLOCK_M=rows, BLOCK_N=triton.next_power_of_2(N),
            num_warps=warps,
        )  # fmt: skip

    ms = do_bench_cudagraph(launch, rep=30)
    moved = M * N * (x.element_size() + 2 + (2 + x.element_size() if residual else 0))
    return ms, moved / ms / 1e6


def backward_tile_ms(M, N, dtype, rows: int, warps: int, per_sm: int, maxnreg: int | None):
    """The backward kernel at one launch shape, with a residual gradient dh, dy in bf16."""
    dev = torch.device("cuda")
    x = torch.randn(M, N, device=dev, dtype=dtype)
    dy = torch.randn(M, N, device=dev, dtype=torch.bfloat16)
    dh = torch.randn(M, N, device=dev, dtype=dtype)
    dx = torch.empty_like(x)
    w = torch.randn(N, device=dev)
    rstd = torch.rand(M, device=dev) + 0.5
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    n_programs = max(1, min(triton.cdiv(M, rows), sms * per_sm))
    dw_partial = torch.empty(n_programs, N, device=dev)
    options = {} if maxnreg is None else {"maxnreg": maxnreg}

    def launch() -> None:
        rn._rms_norm_bwd_kernel[(n_programs,)](
            dy, x, w, rstd, dh, dx, dw_partial,
            dy.stride(0), x.stride(0), dh.stride(0), dx.stride(0), M, N,
            HAS_DH=True, BLOCK_M=rows, BLOCK_N=triton.next_power_of_2(N), num_warps=warps,
            **options,
        )  # fmt: skip

    ms = do_bench_cudagraph(launch, rep=30)
    return ms, M * N * (2 + 3 * x.element_size()) / ms / 1e6


def backward_ms(M: int, N: int, dtype: torch.dtype):
    """The production backward (its own launch shape) with a residual gradient dh, dy in bf16."""
    dev = torch.device("cuda")
    x = torch.randn(M, N, device=dev, dtype=dtype)
    dy = torch.randn(M, N, device=dev, dtype=torch.bfloat16)
    dh = torch.randn(M, N, device=dev, dtype=dtype)
    w = torch.randn(N, device=dev)
    rstd = torch.rand(M, device=dev) + 0.5
    ms = do_bench_cudagraph(lambda: rn._backward(dy, x, w, rstd, dh), rep=30)
    return ms, M * N * (2 + 3 * x.element_size()) / ms / 1e6


def main() -> None:
    for M, N, dtype in SHAPES:
        ms, gbs = backward_ms(M, N, dtype)
        row = {"op": "bwd (production tiles)", "shape": [M, N], "dtype": str(dtype)}
        print(json.dumps({**row, "ms": round(ms, 4), "GBs": round(gbs)}), flush=True)
        for rows, warps, per_sm, maxnreg in BWD_GRID:
            if rows * triton.next_power_of_2(N) > 32768:
                continue
            ms, gbs = backward_tile_ms(M, N, dtype, rows, warps, per_sm, maxnreg)
            row = {"op": "bwd", "shape": [M, N], "dtype": str(dtype), "rows": rows}
            tile = {"warps": warps, "per_sm": per_sm, "maxnreg": maxnreg}
            print(json.dumps({**row, **tile, "ms": round(ms, 4), "GBs": round(gbs)}), flush=True)
        for residual in (False, True):
            for rows, warps in FWD_TILES:
                if rows * triton.next_power_of_2(N) > 32768:
                    continue
                ms, gbs = forward_ms(M, N, dtype, rows, warps, residual)
                row = {"op": "fwd", "residual": residual, "shape": [M, N], "dtype": str(dtype)}
                tile = {"rows": rows, "warps": warps}
                print(
                    json.dumps({**row, **tile, "ms": round(ms, 4), "GBs": round(gbs)}), flush=True
                )


if __name__ == "__main__":
    main()
