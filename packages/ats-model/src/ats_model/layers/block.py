"""The pre-norm transformer block and the per-forward context every block reads.

x ─┬─ attn_norm ─ attn ─(+)─┬─ ffn_norm ─ ffn ─(+)─> out      ffn = SwiGLUFFN or MoEFFN
   └────────────────────────┘└─────────────────────┘
"""

from dataclasses import dataclass, field

import torch
from ats_kernels import KernelSet
from torch import nn

from ats_model.config import ModelConfig
from ats_model.layers.attention import Attention
from ats_model.layers.kv_cache import KVCache, KVLayer
from ats_model.layers.moe import MoEFFN, MoERecord
from ats_model.layers.norm import RMSNorm


@dataclass
class MoDRecord:
    predictor_loss: torch.Tensor | None  # BCE of the causal predictor (None without one)
    selected_fraction: torch.Tensor  # detached scalar
    predictor_accuracy: torch.Tensor  # detached scalar


@dataclass
class Context:
    """What one model forward shares with all its blocks."""

    cos: torch.Tensor  # (T, hd) or (B, T, hd) for this call's tokens
    sin: torch.Tensor
    positions: torch.Tensor  # (B, T) int64 RoPE position of each token
    cos_table: torch.Tensor  # (max_seq_len, hd): MoD blocks look up the positions they keep
    sin_table: torch.Tensor
    mask: torch.Tensor | None  # (B, 1, T, L) for plain blocks; None = pure causal (is_causal)
    key_valid: torch.Tensor | None  # (B, L) bool, False on pad slots; None = no padding
    cache: KVCache | None
    start: int  # slot of this call's first token (cache length before the call)
    causal_routing: bool  # MoD: decide per token with the causal predictor (generation)
    moe_records: list[MoERecord] = field(default_factory=list)
    mod_records: list[MoDRecord] = field(default_factory=list)


class Block(nn.Module):
    def __init__(
        self, config: ModelConfig, layer_idx: int, ffn: nn.Module, kernels: KernelSet
    ) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.attn_norm = RMSNorm(config.dim, config.norm_eps, kernels)
        self.attn = Attention(config, kernels)
        self.ffn_norm = RMSNorm(config.dim, config.norm_eps, kernels)
        self.ffn = ffn
        self.resid_drop = nn.Dropout(config.dropout)  # identity when dropout == 0 or in eval

    def init_weights(self, std: float, resid_std: float) -> None:
        self.attn_norm.init_weights()
        self.ffn_norm.init_weights()
        self.attn.init_weights(std, resid_std)
        self.ffn.init_weights(std, resid_std)

    def cache_layer(self, ctx: Context) -> KVLayer | None:
        return None if ctx.cache is None else ctx.cache.layers[self.layer_idx]

    def _ffn(self, h: torch.Tensor, ctx: Context) -> torch.Tensor:
        if isinstance(self.ffn, MoEFFN):
            y, record = self.ffn(h)
            ctx.moe_records.append(record)
            return y
        return self.ffn(h)

    def delta(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | None,
        cache: KVLayer | None,
        ctx: Context,
    ) -> torch.Tensor:
        """What the block adds to the residual stream: attn(...) + ffn(...), shape of x."""
        a = self.resid_drop(self.attn(self.attn_norm(x), cos, sin, mask, cache, ctx.start))
        f = self.resid_drop(self._ffn(self.ffn_norm(x + a), ctx))
        return a + f

    def forward(self, x: torch.Tensor, ctx: Context) -> torch.Tensor:
        a = self.attn(
            self.attn_norm(x), ctx.cos, ctx.sin, ctx.mask, self.cache_layer(ctx), ctx.start
        )
        h = x + self.resid_drop(a)
        return h + self.resid_drop(self._ffn(self.ffn_norm(h), ctx))
