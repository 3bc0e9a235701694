"""RoPE tables for a model, and their lookup by position (tables come from ats_kernels.rope_tables)."""

import torch
from ats_kernels import rope_tables

from ats_model.config import ModelConfig


def build_rope_tables(
    config: ModelConfig, device: torch.device | str, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin), each (max_seq_len, head_dim), built in float64 and cast to `dtype`."""
    return rope_tables(
        config.head_dim,
        config.max_seq_len,
        config.rope_theta,
        config.rope_scaling,
        device=device,
        dtype=dtype,
    )


def lookup(table: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """table (L, hd), positions (B, T) int64 -> (B, T, hd)."""
    return table[positions]
