"""Triton cross-entropy, and cross-entropy fused with the LM head (chunked, logits never whole).

One kernel does a row's online logsumexp (Milakov & Gimelshein 2018) over the vocabulary and,
when asked, writes d loss / d logits = (softmax - onehot) * scale in place. The fused linear
version follows Liger-Kernel's FusedLinearCrossEntropy: per chunk of tokens, logits = h_c @ w.T,
the kernel turns them into their gradient, then grad_h_c = dlogits @ w and grad_w += dlogits.T @ h_c,
all inside forward; backward only scales the stored gradients by d loss.
"""

import torch
import triton
import triton.language as tl

from ats_kernels.triton.launch import check_on_device

_IO_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
BLOCK_V = 4096
CHUNK_BYTES = 1 << 27  # auto chunk: the largest power-of-two rows whose logits fit in 128 MiB


@triton.jit
def _ce_kernel(
    L, stride_l, G, stride_g, TGT, LOSS, LSE, SCALE,
    V, ignore_index,
    LSE_GIVEN: tl.constexpr, WRITE_LOSS: tl.constexpr, WRITE_GRAD: tl.constexpr,
    BLOCK_V: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    base = L + row * stride_l
    tgt = tl.load(TGT + row)
    offs = tl.arange(0, BLOCK_V)
    if LSE_GIVEN:
        lse = tl.load(LSE + row)
    else:
        m = float("-inf")
        s = 0.0
        for v0 in range(0, V, BLOCK_V):
            x = tl.load(base + v0 + offs, mask=v0 + offs < V, other=float("-inf")).to(tl.float32)
            m_new = tl.maximum(m, tl.max(x, axis=0))
            s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
            m = m_new
        lse = m + tl.log(s)
        tl.store(LSE + row, lse)
    valid = tgt != ignore_index
    if WRITE_LOSS:
        x_t = tl.load(base + tgt, mask=valid, other=0.0).to(tl.float32)
        tl.store(LOSS + row, tl.where(valid, lse - x_t, 0.0))
    if WRITE_GRAD:
        scale = tl.where(valid, tl.load(SCALE), 0.0)  # d loss / n_valid; ignored rows get 0
        g_base = G + row * stride_g
        for v0 in range(0, V, BLOCK_V):
            cols = v0 + offs
            mask = cols < V
            x = tl.load(base + cols, mask=mask, other=0.0).to(tl.float32)
            grad = (tl.exp(x - lse) - tl.where(cols == tgt, 1.0, 0.0)) * scale
            tl.store(g_base + cols, grad.to(G.dtype.element_ty), mask=mask)


def _check_targets(targets: torch.Tensor, n_rows: int, V: int, ignore_index: int, op: str) -> None:
    if targets.shape != (n_rows,):
        raise ValueError(f"{op}: targets shape {tuple(targets.shape)} != ({n_rows},)")
    # an out-of-range target would read out of bounds
    bad = ((targets < 0) | (targets >= V)) & (targets != ignore_index)
    if targets.is_cuda:  # checked on the device: no stream sync (and CUDA-graph capturable)
        check_on_device(
            ~bad.any(),
            f"{op}: a target is outside [0, {V}) and is not ignore_index = {ignore_index}",
        )
    elif bool(bad.any()):
        first = int(targets[bad][0])
        raise ValueError(
            f"{op}: target {first} is outside [0, {V}) and is not ignore_index = {ignore_index}"
        )


def _launch(
    logits, grad, targets, loss, lse, scale, ignore_index, lse_given, write_loss, write_grad
):
    N, V = logits.shape
    if N == 0:
        return
    _ce_kernel[(N,)](
        logits, logits.stride(0), grad, grad.stride(0), targets, loss, lse, scale,
        V, ignore_index,
        LSE_GIVEN=lse_given, WRITE_LOSS=write_loss, WRITE_GRAD=write_grad,
        BLOCK_V=BLOCK_V, num_warps=8,
    )  # fmt: skip


class _CrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, ignore_index: int):
        N = logits.shape[0]
        lse = torch.empty(N, device=logits.device, dtype=torch.float32)
        loss_rows = torch.empty(N, device=logits.device, dtype=torch.float32)
        _launch(logits, logits, targets, loss_rows, lse, lse, ignore_index, False, True, False)
        n_valid = (targets != ignore_index).sum().to(torch.float32)
        ctx.save_for_backward(logits, targets, lse, n_valid)
        ctx.ignore_index = ignore_index
        return loss_rows.sum() / n_valid

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        logits, targets, lse, n_valid = ctx.saved_tensors
        scale = (grad_out.to(torch.float32) / n_valid).reshape(1)
        grad = torch.empty_like(logits)
        _launch(logits, grad, targets, lse, lse, scale, ctx.ignore_index, True, False, True)
        return grad, None, None


def cross_entropy(
    logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100
) -> torch.Tensor:
    """Same result as ref_cross_entropy: logits (N, V), targets (N,) -> mean over non-ignored."""
    if logits.dim() != 2 or logits.dtype not in _IO_DTYPES:
        raise ValueError(
            f"cross_entropy: logits must be 2-D {_IO_DTYPES}, got {tuple(logits.shape)} {logits.dtype}"
        )
    _check_targets(targets, logits.shape[0], logits.shape[1], ignore_index, "cross_entropy")
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    return _CrossEntropy.apply(logits, targets.contiguous(), ignore_index)


def auto_chunk_size(n_vocab: int, dtype: torch.dtype) -> int:
    """Rows per chunk: the largest power of two whose (rows, V) logits fit in CHUNK_BYTES, >= 64.

    At V = 128256 in bf16 that is 512 rows: logits 128 MiB, so peak memory is about the size of
    grad_w; larger chunks are no faster (every GEMM stays compute-bound down to ~512 rows)."""
    row_bytes = n_vocab * torch.finfo(dtype).bits // 8
    rows = max(1, CHUNK_BYTES // row_bytes)
    return max(64, 1 << (rows.bit_length() - 1))


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, w, targets, ignore_index: int, chunk_size: int, grad_enabled: bool):
        N, C = h.shape
        V = w.shape[0]
        # needs_input_grad is True under torch.no_grad too: also ask whether grad mode was on
        need_h = grad_enabled and ctx.needs_input_grad[0]
        need_w = grad_enabled and ctx.needs_input_grad[1]
        need_grad = need_h or need_w
        n_valid = (targets != ignore_index).sum().to(torch.float32)
        scale = (1.0 / n_valid).reshape(1)
        loss_rows = torch.empty(N, device=h.device, dtype=torch.float32)
        lse = torch.empty(N, device=h.device, dtype=torch.float32)
        grad_h = torch.empty_like(h) if need_h else None
        # accumulated in w.dtype across chunks (as Liger): no (V, C) fp32 buffer
        grad_w = torch.empty_like(w) if need_w else None
        logits_buf = torch.empty((min(chunk_size, N), V), device=h.device, dtype=h.dtype)
        for start in range(0, N, chunk_size):
            stop = min(start + chunk_size, N)
            h_c = h[start:stop]  # (n, C)
            logits = logits_buf[: stop - start]  # (n, V)
            torch.mm(h_c, w.T, out=logits)
            _launch(logits, logits, targets[start:stop], loss_rows[start:stop], lse[start:stop],
                    scale, ignore_index, False, True, need_grad)  # fmt: skip
            if need_h:
                torch.mm(logits, w, out=grad_h[start:stop])  # logits now hold d loss / d logits
            if need_w and start == 0:
                torch.mm(logits.T, h_c, out=grad_w)
            elif need_w:
                grad_w.addmm_(logits.T, h_c)
        ctx.save_for_backward(grad_h, grad_w)
        return loss_rows.sum() / n_valid

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        grad_h, grad_w = ctx.saved_tensors
        g = grad_out.to(torch.float32)
        if grad_h is not None:
            grad_h = grad_h.mul_(g)
        if grad_w is not None:
            grad_w = grad_w.mul_(g)
        return grad_h, grad_w, None, None, None, None


def linear_cross_entropy(
    h: torch.Tensor,
    w: torch.Tensor,
    targets: torch.Tensor,
    ignore_index: int = -100,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """Same result as ref_linear_cross_entropy: h (N, C), w (V, C), targets (N,) -> mean loss.

    Logits are rounded to h.dtype (as h @ w.T is in the reference) and live one chunk at a time;
    chunk_size None picks auto_chunk_size. Backward may be called once (grads are stored in forward).
    """
    if h.dim() != 2 or w.dim() != 2 or h.shape[1] != w.shape[1]:
        raise ValueError(
            f"linear_cross_entropy: h {tuple(h.shape)} and w {tuple(w.shape)} must be (N, C), (V, C)"
        )
    if h.dtype != w.dtype or h.dtype not in _IO_DTYPES:
        raise ValueError(
            f"linear_cross_entropy: h {h.dtype} and w {w.dtype} must share one of {_IO_DTYPES}"
        )
    _check_targets(targets, h.shape[0], w.shape[0], ignore_index, "linear_cross_entropy")
    chunk = auto_chunk_size(w.shape[0], h.dtype) if chunk_size is None else chunk_size
    if chunk < 1:
        raise ValueError(f"linear_cross_entropy: chunk_size = {chunk_size} must be >= 1")
    return _LinearCrossEntropy.apply(
        h.contiguous(), w, targets.contiguous(), ignore_index, chunk, torch.is_grad_enabled()
    )
