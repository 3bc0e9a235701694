"""Mixture-of-Depths block (Raposo et al. 2024, arXiv:2404.02258).

A routed block processes only some tokens of each sequence; the others pass through on the
residual and cost nothing. Selected tokens are gathered (order kept, original RoPE positions),
run through attention (among themselves only) and the FFN, and scattered back:

    out_i = x_i + w_i * block_delta(x_sel)_i   selected i        out_i = x_i   otherwise

Routing:
- learned: a linear router scores tokens; the top k = ceil(capacity * T) (at least 1) of each
  sequence are kept; w = sigmoid(router logit), so the router gets gradient through w (the paper
  multiplies by the raw logit; the sigmoid keeps the scale in (0, 1)). Top-k over a sequence sees
  the future, so a causal predictor (small MLP on the detached block input) is trained with BCE
  against the top-k choice (the paper's "auxiliary MLP predictor", section 3.5); with
  `causal_routing` (generation) a token is kept when predictor logit > 0, i.e. sigmoid > 0.5.
- static: position p is kept when floor((p+1) * c) > floor(p * c) (c = 0.5: every other token).
- random: position p is kept when hash(seed, layer, p) < c; seeded, fixed per position.
Static and random rules depend on the position only, so they are causal by construction; w = 1.
"""

import torch
import torch.nn.functional as F
from ats_kernels import KernelSet
from torch import nn

from ats_model.config import ModelConfig, mod_top_k
from ats_model.layers.attention import causal_mask
from ats_model.layers.block import Block, BlockOutput, Context, MoDRecord
from ats_model.layers.moe import MoERecord
from ats_model.layers.rope import lookup


class MoDPredictor(nn.Module):
    """Causal per-token predictor of "top-k would keep this token": w_out(silu(w_in x))."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w_in = nn.Linear(dim, hidden, bias=False)
        self.w_out = nn.Linear(hidden, 1, bias=False)

    def init_weights(self, std: float) -> None:
        nn.init.normal_(self.w_in.weight, std=std)
        nn.init.normal_(self.w_out.weight, std=std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_out(F.silu(self.w_in(x))).squeeze(-1)  # (B, T) logits


def position_hash(positions: torch.Tensor, seed: int) -> torch.Tensor:
    """Uniform-looking values in [0, 1) per position: three rounds of an LCG mod 2^31 (int64 safe)."""
    m = 2**31
    h = (positions.long() * 1103515245 + 12345 + (seed % m) * 2654435761) % m
    for _ in range(3):
        h = (h * 1103515245 + 12345) % m
        h = h ^ (h >> 13)
    return h.double() / m


def gather_selected(sel: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """sel (B, T) bool -> (idx (B, K), slot_valid (B, K)) with K = max count; selected tokens
    first in their original order, padded with unselected ones (slot_valid False). None if K = 0."""
    k_max = int(sel.sum(1).max())
    if k_max == 0:
        return None
    order = torch.argsort((~sel).to(torch.int32), dim=1, stable=True)[:, :k_max]  # (B, K)
    return order, sel.gather(1, order)


class MoDBlock(Block):
    """Runtime knob: `capacity` (fraction kept per sequence); set it between steps for a schedule."""

    def __init__(
        self, config: ModelConfig, layer_idx: int, ffn: nn.Module, kernels: KernelSet
    ) -> None:
        super().__init__(config, layer_idx, ffn, kernels)
        mod = config.mod
        self.capacity = mod.capacity
        self.routing = mod.routing
        self.seed = mod.seed * 100003 + layer_idx
        if self.routing == "learned":
            self.mod_router = nn.Linear(config.dim, 1, bias=False)
            self.mod_predictor = MoDPredictor(config.dim, mod.predictor_dim)

    def init_weights(self, std: float, resid_std: float) -> None:
        super().init_weights(std, resid_std)
        if self.routing == "learned":
            nn.init.normal_(self.mod_router.weight, std=std)
            self.mod_predictor.init_weights(std)

    def _rule(self, positions: torch.Tensor) -> torch.Tensor:
        """Static / random keep-mask (B, T) from positions alone."""
        p = positions.double()
        if self.routing == "static":
            c = self.capacity
            return torch.floor(torch.round((p + 1) * c, decimals=9)) > torch.floor(
                torch.round(p * c, decimals=9)
            )
        return position_hash(positions, self.seed) < self.capacity

    def forward(
        self, x: torch.Tensor, ctx: Context, pending: torch.Tensor | None = None
    ) -> BlockOutput:
        """As Block.forward; the pending add is done first (routing reads the whole stream), and
        the block returns its stream complete."""
        if pending is not None:
            x = x + pending
        B, T, C = x.shape
        valid = None if ctx.key_valid is None else ctx.key_valid[:, ctx.start : ctx.start + T]
        causal = ctx.causal_routing or ctx.cache is not None
        bce, accuracy = None, torch.ones((), device=x.device)
        weight = None  # (B, T) router weight of each token; None = 1 (static / random)
        picked = None  # (idx (B, K), slot_valid (B, K) or None = all valid) when known up front
        if self.routing == "learned":
            logit = self.mod_router(x).squeeze(-1)  # (B, T)
            weight = torch.sigmoid(logit)
            scores = logit.detach()
            if valid is not None:
                scores = scores.masked_fill(~valid, float("-inf"))
            top = torch.topk(scores, mod_top_k(self.capacity, T), dim=1).indices  # (B, k)
            target = torch.zeros_like(scores).scatter(1, top, 1.0)  # (B, T) top-k choice
            pred = self.mod_predictor(x.detach())  # (B, T)
            w_tok = torch.ones_like(target) if valid is None else valid.to(target.dtype)
            bce = (F.binary_cross_entropy_with_logits(pred, target, reduction="none") * w_tok).sum()
            bce = bce / w_tok.sum()
            with torch.no_grad():
                hit = ((pred > 0) == (target > 0.5)).to(w_tok.dtype)
                accuracy = ((hit * w_tok).sum() / w_tok.sum()).float()
            sel = pred > 0 if causal else target > 0.5
            if not causal and valid is None:
                # exactly k per row: the gather order is the top-k positions in sequence order,
                # known without reading the count back (no host sync in a training step)
                picked = (top.sort(dim=1).values, None)
        else:
            sel = self._rule(ctx.positions)
        if valid is not None:
            sel = sel & valid
        n_valid = T * B if valid is None else valid.sum()
        fraction = (sel.sum() / n_valid).detach().float()
        record = MoDRecord(bce, fraction, accuracy)
        if ctx.cache is not None:
            out, moe = self._forward_cached(x, ctx, sel, weight)
        else:
            out, moe = self._forward_gathered(x, ctx, picked or gather_selected(sel), weight)
        return BlockOutput(out, moe, record, None)

    def _forward_gathered(
        self,
        x: torch.Tensor,
        ctx: Context,
        picked: tuple[torch.Tensor, torch.Tensor | None] | None,
        weight: torch.Tensor | None,
    ) -> tuple[torch.Tensor, MoERecord | None]:
        """Run the block on the picked tokens only (the compute saving), scatter deltas back.
        picked: (idx (B, K), slot_valid (B, K), None when every slot is valid), None when no token
        was selected. Returns the new stream and the FFN's MoE record (None without tokens)."""
        B, T, C = x.shape
        if picked is None:
            return x, None
        idx, slot_valid = picked  # (B, K)
        x_sel = x.gather(1, idx[..., None].expand(-1, -1, C))  # (B, K, C)
        pos = ctx.positions.gather(1, idx)  # (B, K)
        cos, sin = lookup(ctx.cos_table, pos), lookup(ctx.sin_table, pos)  # (B, K, hd)
        if slot_valid is not None and bool(slot_valid.all()):
            slot_valid = None
        if slot_valid is None:
            mask = None  # every sequence keeps K tokens: plain causal attention over the subset
        else:
            mask = causal_mask(torch.arange(idx.shape[1], device=x.device), slot_valid)
        delta, moe = self.delta(x_sel, cos, sin, mask, None, ctx)  # (B, K, C)
        scale = None if slot_valid is None else slot_valid.to(delta.dtype)
        if weight is not None:
            w = weight.gather(1, idx)  # (B, K)
            scale = w if scale is None else scale * w
        if scale is None:
            return x.scatter_add(1, idx[..., None].expand(-1, -1, C), delta.to(x.dtype)), moe
        # under autocast the block's matmuls give a lower-precision delta than the fp32 stream
        update = (delta * scale[..., None]).to(x.dtype)
        return x.scatter_add(1, idx[..., None].expand(-1, -1, C), update), moe

    def _forward_cached(
        self, x: torch.Tensor, ctx: Context, sel: torch.Tensor, weight: torch.Tensor | None
    ) -> tuple[torch.Tensor, MoERecord | None]:
        """Incremental decoding: keys of skipped tokens are marked invalid in this layer's cache."""
        B, T, C = x.shape
        layer = self.cache_layer(ctx)
        end = ctx.start + T
        layer.valid[:, ctx.start : end] = sel
        if not bool(sel.any()):
            return x, None
        mask = causal_mask(torch.arange(ctx.start, end, device=x.device), layer.valid[:, :end])
        delta, moe = self.delta(x, ctx.cos, ctx.sin, mask, layer, ctx)  # (B, T, C)
        scale = sel.to(delta.dtype)
        if weight is not None:
            scale = scale * weight
        return x + delta * scale[..., None], moe
