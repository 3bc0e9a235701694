"""Rotary position embeddings (Su et al. 2021) in the HF Llama half-split convention.

Tables are built in float64 and cast, so long contexts keep their precision; optional Llama-3.1
frequency scaling stretches low frequencies for contexts past the original training length.
"""

import math
from typing import Any

import torch


def _scale_inv_freq(inv_freq: torch.Tensor, scaling: Any) -> torch.Tensor:
    """Llama 3.1 `rope_type="llama3"`: divide low frequencies by `factor`, keep high ones, blend between."""
    factor = float(scaling.factor)
    low, high = float(scaling.low_freq_factor), float(scaling.high_freq_factor)
    old_len = float(scaling.original_max_seq_len)
    wavelen = 2 * math.pi / inv_freq
    low_freq_wavelen, high_freq_wavelen = old_len / low, old_len / high
    smooth = (old_len / wavelen - low) / (high - low)
    blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    out = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    mid = (wavelen <= low_freq_wavelen) & (wavelen >= high_freq_wavelen)
    return torch.where(mid, blended, out)


def rope_tables(
    head_dim: int,
    max_seq_len: int,
    theta: float = 10000.0,
    scaling: Any = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin), each (max_seq_len, head_dim): angle t * theta^(-2i/hd), the half repeated twice.

    `scaling` is any object with factor / low_freq_factor / high_freq_factor / original_max_seq_len
    (ats_model.config.RopeScaling), or None.
    """
    if head_dim % 2 != 0:
        raise ValueError(f"rope_tables: head_dim = {head_dim} must be even (RoPE rotates pairs)")
    idx = torch.arange(0, head_dim, 2, dtype=torch.float64, device=device)
    inv_freq = 1.0 / (theta ** (idx / head_dim))  # (hd/2,)
    if scaling is not None:
        inv_freq = _scale_inv_freq(inv_freq, scaling)
    t = torch.arange(max_seq_len, dtype=torch.float64, device=device)
    angles = torch.outer(t, inv_freq)  # (T, hd/2)
    emb = torch.cat([angles, angles], dim=-1)  # (T, hd): half-split layout
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def ref_rope(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q (B, n_head, T, hd) and k (B, n_kv_head, T, hd).

    cos/sin are (T, hd) shared by the batch, or (B, T, hd) per-position (KV cache, left padding).
    """
    if cos.dim() == 2:
        cos, sin = cos[None, None], sin[None, None]  # (1, 1, T, hd)
    elif cos.dim() == 3:
        cos, sin = cos[:, None], sin[:, None]  # (B, 1, T, hd)
    else:
        raise ValueError(f"rope: cos must be (T, hd) or (B, T, hd), got shape {tuple(cos.shape)}")
    cos, sin = cos.to(q.dtype), sin.to(q.dtype)
    q_out = q * cos + _rotate_half(q) * sin
    k_out = k * cos + _rotate_half(k) * sin
    return q_out, k_out


def ref_rope_qkv(
    qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, n_head: int, n_kv_head: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """qkv (B, T, (n_head + 2 n_kv_head) hd), the output of one fused q|k|v projection ->
    (q, k, v) as (B, heads, T, hd) views, q and k rotated by ref_rope."""
    B, T, width = qkv.shape
    heads = n_head + 2 * n_kv_head
    if width % heads or (width // heads) % 2:
        raise ValueError(
            f"rope_qkv: qkv width {width} is not {heads} heads (n_head {n_head} + 2 x n_kv_head "
            f"{n_kv_head}) of an even head_dim"
        )
    hd = width // heads
    q, k, v = qkv.view(B, T, heads, hd).split([n_head, n_kv_head, n_kv_head], dim=2)
    q, k = ref_rope(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
    return q, k, v.transpose(1, 2)
