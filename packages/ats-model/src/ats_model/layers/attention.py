"""Grouped-query causal self-attention through F.scaled_dot_product_attention, with RoPE and KV cache.

q heads:  0 1 | 2 3 | 4 5 | 6 7        n_head = 8, n_kv_head = 4, group g = 2
kv heads:  0  |  1  |  2  |  3         kv head j serves q heads j*g .. j*g+g-1 (HF repeat_kv)

With `fused` set (ats-train sets it, Transformer.fuse_projections) and gradients on, q, k and v
come from one GEMM over wqkv = [wq; wk; wv], concatenated per forward (the weights stay three
parameters: names and checkpoints do not change), and kernels.rope_qkv splits and rotates its
output: the input gradient is then one GEMM over one (B, T, width) gradient instead of three GEMMs
and a sum. Without gradients (inference, evaluation) there is no backward to pay for the
concatenation, which copies every weight per call (at decode, most of the cost): the three
projections run on the weights in place. LoRA adapters on wq/wk/wv (layers/lora.py) add their
output to the fused GEMM's.
"""

import torch
import torch.nn.functional as F
from ats_kernels import KernelSet
from torch import nn

from ats_model.config import ModelConfig
from ats_model.layers.kv_cache import KVLayer
from ats_model.layers.lora import fused_lora_delta


def causal_mask(q_slots: torch.Tensor, key_valid: torch.Tensor) -> torch.Tensor:
    """q_slots (T,) int64 slot of each query, key_valid (B, L) bool -> SDPA mask (B, 1, T, L).

    A query sees valid keys at slots <= its own. Its own slot is always allowed, so a pad query
    (or a token a MoD layer skipped) still has one key and yields a finite, discarded output
    instead of the NaN of an all-masked softmax row.
    """
    k_slots = torch.arange(key_valid.shape[1], device=key_valid.device)
    causal = k_slots[None, :] <= q_slots[:, None]  # (T, L)
    own = k_slots[None, :] == q_slots[:, None]  # (T, L)
    allowed = (causal[None] & key_valid[:, None, :]) | own[None]  # (B, T, L)
    return allowed[:, None]  # (B, 1, T, L)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, kernels: KernelSet) -> None:
        super().__init__()
        self.kernels = kernels
        self.n_head, self.n_kv_head, self.head_dim = (
            config.n_head,
            config.n_kv_head,
            config.head_dim,
        )
        self.wq = nn.Linear(config.dim, config.n_head * config.head_dim, bias=False)
        self.wk = nn.Linear(config.dim, config.n_kv_head * config.head_dim, bias=False)
        self.wv = nn.Linear(config.dim, config.n_kv_head * config.head_dim, bias=False)
        self.wo = nn.Linear(config.n_head * config.head_dim, config.dim, bias=False)
        self.dropout = config.dropout  # on the attention weights, in training only
        self.fused = False  # one wqkv GEMM when gradients are on (module docstring)

    def init_weights(self, std: float, resid_std: float) -> None:
        for lin in (self.wq, self.wk, self.wv):
            nn.init.normal_(lin.weight, std=std)
        nn.init.normal_(self.wo.weight, std=resid_std)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | None,
        cache: KVLayer | None = None,
        start: int = 0,
    ) -> torch.Tensor:
        """x (B, T, C); cos/sin (T, hd) or (B, T, hd); mask (B, 1, T, L) bool or None = plain causal.

        With `cache`, this call's keys/values are written at slots [start, start + T) and the
        queries attend to slots [0, start + T) (mask required).
        """
        B, T, _ = x.shape
        if self.fused and torch.is_grad_enabled():
            wqkv = torch.cat([self.wq.weight, self.wk.weight, self.wv.weight])  # ((nh+2nkv) hd, C)
            # q (B, nh, T, hd) and k (B, nkv, T, hd) rotated, v (B, nkv, T, hd)
            qkv = F.linear(x, wqkv)  # (B, T, (nh+2nkv) hd)
            lora = fused_lora_delta((self.wq, self.wk, self.wv), x)
            if lora is not None:
                qkv = qkv + lora
            q, k, v = self.kernels.rope_qkv(qkv, cos, sin, self.n_head, self.n_kv_head)
        else:
            q = self.wq(x).view(B, T, self.n_head, self.head_dim).transpose(1, 2)
            k = self.wk(x).view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)
            v = self.wv(x).view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)
            q, k = self.kernels.rope(q, k, cos, sin)
        if cache is not None:
            if mask is None:
                raise ValueError("Attention: a KV cache needs an explicit mask (slots are offset)")
            cache.k[:, :, start : start + T] = k
            cache.v[:, :, start : start + T] = v
            k, v = cache.k[:, :, : start + T], cache.v[:, :, : start + T]  # (B, nkv, L, hd)
        y = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            is_causal=mask is None,
            dropout_p=self.dropout if self.training else 0.0,
            enable_gqa=self.n_head != self.n_kv_head,
        )  # (B, nh, T, hd)
        y = y.transpose(1, 2).reshape(B, T, self.n_head * self.head_dim)  # (B, T, nh*hd)
        return self.wo(y)
