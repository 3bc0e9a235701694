"""Cross-entropy with its gradient written in place, as the fused head + loss runs it (loss and
d loss / d logits in forward): launch shapes on the H200 at the 124M model's 32768 x 50304 bf16.

The two-pass row kernel (online logsumexp, then the gradient) reads each row twice; with one
program per row, ~1000 rows of 100 KB are in flight, more than the 50 MB L2, so the second read
goes to HBM too (9.9 GB moved for 6.6 GB needed). Variants: persistent programs that take rows in
turn (fewer rows in flight, the second read hits L2), and one program holding its whole row in
registers (one read). Prints ms per call and bytes-needed / time.

H200, 2026-12-01 (copy 1.547 ms): one program per row, 8 warps, 2.635 ms (the kernel the model
uses: at its two-reads-one-write floor of ~2.3 ms); persistent programs 2.77-5.62 ms (1-8 per SM,
8 or 16 warps: fewer rows in flight starve HBM more than L2 hits save); whole row in registers
11.4-15.5 ms (spills at 65536 columns) and its losses did not match torch's (not pursued). The
kernel stays one program per row.

Run on a GPU: python3 packages/ats-kernels/dev/cross_entropy/fwd_grad_sweep.py
"""

import torch
import triton
import triton.language as tl
from triton.testing import do_bench


@triton.jit
def _two_pass(L, stride_l, TGT, LOSS, SCALE, N, V, BLOCK_V: tl.constexpr):
    offs = tl.arange(0, BLOCK_V)
    scale = tl.load(SCALE)
    for row in range(tl.program_id(0), N, tl.num_programs(0)):
        base = L + row.to(tl.int64) * stride_l
        tgt = tl.load(TGT + row)
        m = float("-inf")
        s = 0.0
        for v0 in range(0, V, BLOCK_V):
            x = tl.load(base + v0 + offs, mask=v0 + offs < V, other=float("-inf")).to(tl.float32)
            m_new = tl.maximum(m, tl.max(x, axis=0))
            s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
            m = m_new
        lse = m + tl.log(s)
        x_t = tl.load(base + tgt).to(tl.float32)
        tl.store(LOSS + row, lse - x_t)
        for v0 in range(0, V, BLOCK_V):
            cols = v0 + offs
            mask = cols < V
            x = tl.load(base + cols, mask=mask, other=0.0).to(tl.float32)
            grad = (tl.exp(x - lse) - tl.where(cols == tgt, 1.0, 0.0)) * scale
            tl.store(base + cols, grad.to(L.dtype.element_ty), mask=mask)


@triton.jit
def _whole_row(L, stride_l, TGT, LOSS, SCALE, N, V, BLOCK_V: tl.constexpr):
    offs = tl.arange(0, BLOCK_V)
    scale = tl.load(SCALE)
    for row in range(tl.program_id(0), N, tl.num_programs(0)):
        base = L + row.to(tl.int64) * stride_l
        tgt = tl.load(TGT + row)
        x = tl.load(base + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
        m = tl.max(x, axis=0)
        lse = m + tl.log(tl.sum(tl.exp(x - m), axis=0))
        x_t = tl.load(base + tgt).to(tl.float32)
        tl.store(LOSS + row, lse - x_t)
        grad = (tl.exp(x - lse) - tl.where(offs == tgt, 1.0, 0.0)) * scale
        tl.store(base + offs, grad.to(L.dtype.element_ty), mask=offs < V)


def main() -> None:
    N, V = 32768, 50304
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    src = torch.randn(N, V, device=dev, dtype=torch.bfloat16)
    logits = src.clone()
    tgt = torch.randint(0, V, (N,), device=dev)
    loss = torch.empty(N, device=dev)
    scale = torch.full((1,), 1.0 / N, device=dev)
    need = 2 * N * V * 2  # read + write once
    copy_ms = do_bench(lambda: logits.copy_(src))
    print(f"copy {N}x{V} bf16: {copy_ms:.3f} ms, {need / copy_ms / 1e6:.0f} GB/s")

    def bench(name, kernel, grid, block_v, warps) -> None:
        def call() -> None:
            kernel[(grid,)](logits, logits.stride(0), tgt, loss, scale, N, V,
                            BLOCK_V=block_v, num_warps=warps)  # fmt: skip

        try:
            ms = do_bench(call)
        except Exception as e:  # a launch shape that does not compile is a row, not a crash
            print(f"{name}: failed {type(e).__name__}: {str(e)[:120]}")
            return
        print(f"{name}: {ms:.3f} ms, {need / ms / 1e6:.0f} GB/s (need-based)")

    for warps in (8, 16):
        bench(f"two-pass grid=N warps={warps}", _two_pass, N, 4096, warps)
        for per_sm in (1, 2, 4, 8):
            bench(f"two-pass persistent {per_sm}/SM warps={warps}", _two_pass, sms * per_sm, 4096,
                  warps)  # fmt: skip
    block = triton.next_power_of_2(V)
    for warps in (16, 32):
        for per_sm in (1, 2, 4):
            bench(f"whole-row {per_sm}/SM warps={warps}", _whole_row, sms * per_sm, block, warps)
    logits.copy_(src)
    ref_loss = torch.nn.functional.cross_entropy(src.float(), tgt, reduction="none")
    _whole_row[(sms,)](logits, logits.stride(0), tgt, loss, scale, N, V, BLOCK_V=block,
                       num_warps=16)  # fmt: skip
    print("whole-row max |loss - torch|:", (loss - ref_loss).abs().max().item())


if __name__ == "__main__":
    main()
