"""The pre-norm transformer block, the read-only context every block gets, and what it returns.

x ─┬─ attn_norm ─ attn ─(+)─┬─ ffn_norm ─ ffn ─(+)─> out      ffn = SwiGLUFFN or MoEFFN
   └────────────────────────┘└─────────────────────┘

The add before ffn_norm and the norm itself are one kernel (rms_norm_residual), which returns both
the normalized input of the FFN and the updated residual stream. The block's last add is left to
the next norm the same way: a block returns the stream before it (hidden) and the FFN's output
(pending), and the next block's attn_norm (or the model's final norm) adds them in its own pass.
That saves one read-read-write pass over the stream per block in forward, and in backward the
norm's kernel adds the residual's gradient instead of a separate add.

A block returns its MoE / MoD records with its output (BlockOutput) and the model collects them:
nothing is shared and mutated across module boundaries, so wrappers that rebuild a block's
arguments or outputs (FSDP2 per-block sharding, activation checkpointing) keep every record.
"""

from dataclasses import dataclass
from typing import NamedTuple

import torch
from ats_kernels import KernelSet
from torch import nn

from ats_model.config import ModelConfig
from ats_model.layers.attention import Attention
from ats_model.layers.kv_cache import KVCache, KVLayer
from ats_model.layers.moe import MoEFFN, MoERecord
from ats_model.layers.norm import RMSNorm


class MoDRecord(NamedTuple):  # a NamedTuple for the reason given at MoERecord
    predictor_loss: torch.Tensor | None  # BCE of the causal predictor (None without one)
    selected_fraction: torch.Tensor  # detached scalar
    predictor_accuracy: torch.Tensor  # detached scalar


class BlockOutput(NamedTuple):
    hidden: torch.Tensor  # (B, T, C) the residual stream after the block, less `pending`
    moe: MoERecord | None  # None when the FFN is dense, or an MoD block ran no token
    mod: MoDRecord | None  # None for a plain (not depth-routed) block
    pending: torch.Tensor | None  # (B, T, C) still to be added to hidden, or None

    def stream(self) -> torch.Tensor:
        """The residual stream after the block, with the pending add done."""
        return self.hidden if self.pending is None else self.hidden + self.pending


@dataclass(frozen=True)
class Context:
    """What one model forward shares with all its blocks; read-only (blocks return records)."""

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

    def _ffn(self, h: torch.Tensor) -> tuple[torch.Tensor, MoERecord | None]:
        if isinstance(self.ffn, MoEFFN):
            return self.ffn(h)
        return self.ffn(h), None

    def delta(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | None,
        cache: KVLayer | None,
        ctx: Context,
    ) -> tuple[torch.Tensor, MoERecord | None]:
        """What the block adds to the residual stream, attn(...) + ffn(...) (shape of x), and the
        FFN's MoE record."""
        a = self.resid_drop(self.attn(self.attn_norm(x), cos, sin, mask, cache, ctx.start))
        f, record = self._ffn(self.ffn_norm(x + a))
        return a + self.resid_drop(f), record

    def forward(
        self, x: torch.Tensor, ctx: Context, pending: torch.Tensor | None = None
    ) -> BlockOutput:
        """x (B, T, C) the stream, less the previous block's `pending` output when one is given."""
        if pending is None:
            n = self.attn_norm(x)
        else:
            n, x = self.attn_norm(x, pending)  # x += pending, n = attn_norm(x): one pass
        a = self.attn(n, ctx.cos, ctx.sin, ctx.mask, self.cache_layer(ctx), ctx.start)
        n, h = self.ffn_norm(x, self.resid_drop(a))  # h = x + a, n = ffn_norm(h): one pass
        f, record = self._ffn(n)
        return BlockOutput(h, record, None, self.resid_drop(f))
