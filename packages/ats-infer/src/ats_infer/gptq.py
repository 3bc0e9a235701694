"""GPTQ (Frantar et al. 2022, "GPTQ: Accurate Post-Training Quantization for Generative
Pre-trained Transformers", Algorithm 1) for one weight matrix, into the native runtime's
symmetric layouts (quantize.py): the same grid as round-to-nearest (int4: scale = max|group| / 7,
codes -8..7; int8: scale = max|row| / 127, codes -127..127), so only the rounding choices differ.

    H = 2/n sum x x^T over calibration inputs x      (in, in), the layer's Hessian
    H += damp * mean(diag H) * I                      dampening
    U = cholesky(H^-1, upper)                         rows of U: the OBS updates, in column order
    for each block of `block_size` columns (lazy batch updates):
        for each column j: q_j = quant(w_j); e = (w_j - q_j) / U_jj; W[:, j:blk] -= e U_j,j:blk
        W[:, blk:] -= E U_blk,blk:                    the block's errors applied to the rest once

Scales: an int4 group's scale is taken from its columns' current (error-updated) values when the
sweep reaches the group's first column (groups lie inside blocks: block_size % group_size == 0);
int8 row scales from the original weights, max|row| / 127. An int4 scale is max|w| / 7 times the
factor of `shrink` (by default 1.00, 0.98, ..., 0.80) whose codes leave the least squared error
weighted by diag(H), sum_j H_jj (w_j - q_j s)^2, per row: on 16 levels, clipping a group's
largest weights can cost less than the coarse grid max|w| gives every other weight (the "mse"
scale search of GPTQModel and of llama.cpp's quantizers; shrink=(1.0,) is the paper's max scale).
int8's 255 levels leave nothing to gain: the search raised a test layer's output error there. act_order visits columns by decreasing diag(H) with
every group's scale fixed from the original weights first ("static groups"), so the codes still
belong to contiguous natural-order groups and the result is exact in the native layout (no g_idx).
"""

import torch

QMAX = {8: 127, 4: 7}
QMIN = {8: -127, 4: -8}


def _codes(w: torch.Tensor, scale: torch.Tensor, bits: int) -> torch.Tensor:
    safe = torch.where(scale == 0, torch.ones_like(scale), scale)
    return torch.clamp(torch.round(w / safe), QMIN[bits], QMAX[bits])


SHRINK = tuple(1 - 0.02 * i for i in range(11))


def _group_scale(
    w: torch.Tensor, h_diag: torch.Tensor, bits: int, shrink: tuple[float, ...]
) -> torch.Tensor:
    """w (out, k), h_diag (k,) -> (out,) scale: max|row| / qmax times the factor of `shrink` with
    the least sum_j h_diag_j (w_j - q_j s)^2 in each row (the first factor on ties)."""
    top = w.abs().amax(dim=1) / QMAX[bits]
    best, best_err = top * shrink[0], None
    for factor in shrink:
        s = top * factor
        err = ((w - _codes(w, s[:, None], bits) * s[:, None]) ** 2 * h_diag).sum(dim=1)
        if best_err is None:
            best_err = err
            continue
        better = err < best_err
        best, best_err = torch.where(better, s, best), torch.where(better, err, best_err)
    return best


def gptq_quantize(
    w: torch.Tensor,
    hessian: torch.Tensor,
    bits: int,
    group_size: int | None,
    *,
    damp: float = 0.01,
    block_size: int = 128,
    act_order: bool = False,
    shrink: tuple[float, ...] = SHRINK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """w (out, in), hessian (in, in) -> (codes (out, in) int8 in natural column order, scale
    float32: (out,) for int8, (out, in / group_size) for int4). Math in float64. `shrink`: the
    factors of max|w| / 7 each int4 scale is chosen from (module docstring)."""
    if not shrink or not all(0 < f <= 1 for f in shrink):
        raise ValueError(f"shrink factors must lie in (0, 1], got {shrink}")
    W = w.detach().to(torch.float64).clone()
    H = hessian.detach().to(torch.float64).clone()
    n_out, n_in = W.shape
    if bits == 4 and (n_in % group_size != 0 or block_size % group_size != 0):
        raise ValueError(
            f"group_size {group_size} must divide the row length {n_in} and block_size {block_size}"
        )
    dead = torch.diag(H) == 0  # inputs that were always 0: any weight there gives the same output
    H[dead, dead] = 1
    W[:, dead] = 0
    h_diag = torch.diag(H).clone()  # natural column order
    if bits == 8:
        row_scale = _group_scale(W, h_diag, 8, (1.0,))  # (out,)
    else:
        scale = torch.zeros(n_out, n_in // group_size, dtype=torch.float64)
        if act_order:  # static groups: every scale from the original weights
            for g in range(n_in // group_size):
                cols = slice(g * group_size, (g + 1) * group_size)
                scale[:, g] = _group_scale(W[:, cols], h_diag[cols], 4, shrink)
    perm = torch.argsort(torch.diag(H), descending=True) if act_order else torch.arange(n_in)
    W, H = W[:, perm], H[perm][:, perm]
    H += damp * torch.mean(torch.diag(H)) * torch.eye(n_in, dtype=torch.float64)
    U = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True)
    Q = torch.zeros_like(W)
    for i1 in range(0, n_in, block_size):
        i2 = min(i1 + block_size, n_in)
        W1, E1, U1 = (
            W[:, i1:i2].clone(),
            torch.zeros(n_out, i2 - i1, dtype=torch.float64),
            U[i1:i2, i1:i2],
        )
        for i in range(i2 - i1):
            col = int(perm[i1 + i])  # the column's natural index
            if bits == 8:
                s = row_scale
            else:
                g = col // group_size
                if not act_order and col % group_size == 0:
                    scale[:, g] = _group_scale(
                        W1[:, i : i + group_size], h_diag[col : col + group_size], 4, shrink
                    )
                s = scale[:, g]
            q = _codes(W1[:, i], s, bits)
            Q[:, i1 + i] = q
            err = (W1[:, i] - q * s) / U1[i, i]  # (out,)
            W1[:, i:] -= err[:, None] * U1[i, i:][None, :]
            E1[:, i] = err
        W[:, i2:] -= E1 @ U[i1:i2, i2:]
    codes = torch.empty_like(Q)
    codes[:, perm] = Q  # back to natural column order
    out_scale = row_scale if bits == 8 else scale
    return codes.to(torch.int8), out_scale.to(torch.float32)
