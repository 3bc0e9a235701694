"""Transformer: embeddings -> blocks (chosen by the config's family) -> RMSNorm -> LM head.

Single-device math only: parallelism, compile and checkpointing are applied from outside (ats-train).
"""

import math
from dataclasses import dataclass

import torch
from ats_kernels import KernelSet
from torch import nn

from ats_model import families
from ats_model.config import ModelConfig
from ats_model.layers.attention import Attention, causal_mask
from ats_model.layers.block import Context, MoDRecord
from ats_model.layers.ffn import SwiGLUFFN
from ats_model.layers.kv_cache import KVCache
from ats_model.layers.mod import MoDBlock
from ats_model.layers.moe import MoEFFN, MoERecord
from ats_model.layers.norm import RMSNorm
from ats_model.layers.rope import build_rope_tables, lookup
from ats_model.output import ModelOutput


@dataclass(frozen=True)
class ForwardOptions:
    """How forward computes, not what: choices a caller (ats-train) makes for a run, set once with
    Transformer.set_forward_options. The defaults are the plain path (inference, the model's tests).

    autocast_residual: under autocast, carry the residual stream in the autocast dtype (the
    embedding's output is cast once; every residual add and norm then moves half the bytes), as
    Megatron-Core does by default (fp32_residual_connection = False). Off, the stream stays in
    the embedding's fp32; without autocast it changes nothing.

    fused_loss: a forward given targets runs the LM head and the cross-entropy as one op,
    kernels.linear_cross_entropy, over chunks of `fused_loss_rows` rows (0 = all rows at once),
    and returns logits=None. The Triton op turns each chunk's logits into their gradient in place
    during forward, in one kernel: no second (tokens, vocab) buffer for the gradient."""

    autocast_residual: bool = False
    fused_loss: bool = False
    fused_loss_rows: int = 0

    def __post_init__(self) -> None:
        if self.fused_loss_rows < 0:
            raise ValueError(
                f"ForwardOptions.fused_loss_rows = {self.fused_loss_rows} must be >= 0 (0 = all rows)"
            )


class Transformer(nn.Module):
    def __init__(self, config: ModelConfig, kernels: KernelSet) -> None:
        super().__init__()
        self.config = config
        self.kernels = kernels
        self.options = ForwardOptions()  # set_forward_options
        spec = families.get(config.family)
        # weight passed in: nn.Embedding's own N(0, 1) init is skipped (init_weights owns init)
        self.tok_embeddings = nn.Embedding(
            config.vocab_size, config.dim, _weight=torch.empty(config.vocab_size, config.dim)
        )
        self.emb_drop = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList(
            spec.build_block(config, i, kernels) for i in range(config.n_layer)
        )
        self.norm = RMSNorm(config.dim, config.norm_eps, kernels)
        self.output = (
            None if config.tie_embeddings else nn.Linear(config.dim, config.vocab_size, bias=False)
        )
        # (max_seq_len, head_dim) tables, filled by init_weights (not state: rebuilt, never saved)
        table_shape = (config.max_seq_len, config.head_dim)
        self.register_buffer("rope_cos", torch.empty(table_shape), persistent=False)
        self.register_buffer("rope_sin", torch.empty(table_shape), persistent=False)

    # ---- structure -----------------------------------------------------------------------
    def moe_layers(self) -> list[MoEFFN]:
        return [m for m in self.modules() if isinstance(m, MoEFFN)]

    def mod_layers(self) -> list[MoDBlock]:
        return [m for m in self.layers if isinstance(m, MoDBlock)]

    def fuse_projections(self, on: bool) -> None:
        """Training with gradients on: q|k|v and gate|up each as one GEMM over concatenated
        weights (attention.py, ffn.py). A training choice (ats-train's train.fused_projections),
        off by default: the same math, in a different GEMM blocking."""
        for module in self.modules():
            if isinstance(module, (Attention, SwiGLUFFN)):
                module.fused = on

    def set_forward_options(self, options: ForwardOptions) -> None:
        """How every later forward computes (ForwardOptions); the one way a caller changes it."""
        if not isinstance(options, ForwardOptions):
            raise TypeError(f"set_forward_options: expected ForwardOptions, got {options!r}")
        self.options = options

    @torch.no_grad()
    def init_weights(self) -> None:
        """N(0, init_std) everywhere, residual output projections (wo, w2) scaled by 1/sqrt(2 n_layer)
        (GPT-2, Radford et al. 2019), norms at 1, rope tables rebuilt in float64."""
        std = self.config.init_std
        resid_std = std / math.sqrt(2 * self.config.n_layer)
        nn.init.normal_(self.tok_embeddings.weight, std=std)
        for layer in self.layers:
            layer.init_weights(std, resid_std)
        self.norm.init_weights()
        if self.output is not None:
            nn.init.normal_(self.output.weight, std=std)
        cos, sin = build_rope_tables(self.config, self.rope_cos.device, self.rope_cos.dtype)
        self.rope_cos.copy_(cos)
        self.rope_sin.copy_(sin)

    # ---- forward -------------------------------------------------------------------------
    def forward(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        kv_cache: KVCache | None = None,
        positions: torch.Tensor | None = None,
        causal_routing: bool = False,
        document_ids: torch.Tensor | None = None,
    ) -> ModelOutput:
        """idx (B, T) int64. attention_mask (B, L) with 1 on real tokens (L = cache length + T with a
        cache, else T) for left padding. positions (B, T) overrides RoPE positions (default: count of
        real tokens before each one). causal_routing: MoD decides per token with its causal predictor
        instead of top-k over the sequence (always on with a KV cache). document_ids (B, T): several
        documents packed in one row; a token attends only to earlier tokens of its own document and
        RoPE positions restart at each document, so each document computes as if it were alone."""
        B, T = idx.shape
        start = 0 if kv_cache is None else kv_cache.length
        end = start + T
        self._check_lengths(B, T, end, attention_mask, kv_cache, positions)
        if document_ids is not None:
            self._check_documents(B, T, document_ids, attention_mask, kv_cache, positions)
            positions = document_positions(document_ids)  # (B, T)

        key_valid = None if attention_mask is None else attention_mask.bool()  # (B, L)
        if kv_cache is not None:
            new_valid = True if key_valid is None else key_valid[:, start:end]
            kv_cache.pad_valid[:, start:end] = new_valid
            key_valid = kv_cache.pad_valid[:, :end]
        if positions is None and attention_mask is not None:
            positions = (attention_mask.long().cumsum(1) - 1).clamp(min=0)[:, start:end]  # (B, T)
        if positions is None:
            cos, sin = self.rope_cos[start:end], self.rope_sin[start:end]  # (T, hd)
            positions = torch.arange(start, end, device=idx.device).expand(B, T)
        else:
            cos, sin = (
                lookup(self.rope_cos, positions),
                lookup(self.rope_sin, positions),
            )  # (B, T, hd)
        mask = None
        if key_valid is not None:
            mask = causal_mask(torch.arange(start, end, device=idx.device), key_valid)  # (B,1,T,L)
        if document_ids is not None:
            mask = document_mask(document_ids)  # (B, 1, T, T)

        ctx = Context(
            cos=cos,
            sin=sin,
            positions=positions,
            cos_table=self.rope_cos,
            sin_table=self.rope_sin,
            mask=mask,
            key_valid=key_valid,
            cache=kv_cache,
            start=start,
            causal_routing=causal_routing,
        )
        x = self.emb_drop(self.tok_embeddings(idx))  # (B, T, C)
        if self.options.autocast_residual and torch.is_autocast_enabled(idx.device.type):
            x = x.to(torch.get_autocast_dtype(idx.device.type))
        moe_records: list[MoERecord] = []
        mod_records: list[MoDRecord] = []
        pending = None  # a block's last residual add, left to the next norm (block.py)
        for layer in self.layers:
            x, moe, mod, pending = layer(x, ctx, pending)
            if moe is not None:
                moe_records.append(moe)
            if mod is not None:
                mod_records.append(mod)
        x = self.norm(x) if pending is None else self.norm(x, pending)[0]
        if kv_cache is not None:
            kv_cache.length = end
        aux, stats = _collect(moe_records, mod_records)
        if targets is not None and self.options.fused_loss:
            return ModelOutput(logits=None, loss=self._fused_loss(x, targets), aux=aux, stats=stats)
        # The untied head is called as a module, not read as a weight: a sharding wrapper may
        # materialize a module's parameters only around that module's own forward.
        if self.output is None:
            logits = x @ self.tok_embeddings.weight.T  # (B, T, V)
        else:
            logits = self.output(x)  # (B, T, V)
        loss = None
        if targets is not None:
            loss = self.kernels.cross_entropy(logits.reshape(B * T, -1), targets.reshape(B * T))
        return ModelOutput(logits=logits, loss=loss, aux=aux, stats=stats)

    def _fused_loss(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy of the head's logits of x (B, T, C) against targets (B, T), never
        holding more than fused_loss_rows rows of logits. The head's weight is read directly, here
        in the root's forward; under autocast both operands are cast to its dtype, as the head's
        matmul would be."""
        w = self.tok_embeddings.weight if self.output is None else self.output.weight  # (V, C)
        device = x.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else w.dtype
        h = x.reshape(-1, x.shape[-1]).to(dtype)  # (B*T, C)
        rows = self.options.fused_loss_rows or h.shape[0]
        return self.kernels.linear_cross_entropy(
            h, w.to(dtype), targets.reshape(-1), chunk_size=rows
        )

    def _check_documents(
        self,
        B: int,
        T: int,
        document_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        kv_cache: KVCache | None,
        positions: torch.Tensor | None,
    ) -> None:
        if tuple(document_ids.shape) != (B, T):
            raise ValueError(
                f"forward: document_ids has shape {tuple(document_ids.shape)}, expected {(B, T)}"
            )
        if attention_mask is not None or kv_cache is not None or positions is not None:
            raise ValueError(
                "forward: document_ids (packed training rows) cannot be combined with "
                "attention_mask, kv_cache or positions"
            )
        if self.mod_layers():
            # MoD attends over the tokens it selects with a mask of its own (layers/mod.py)
            raise ValueError(
                "forward: document_ids is not supported by MoD layers; pad examples instead of "
                "packing them"
            )

    def _check_lengths(
        self,
        B: int,
        T: int,
        end: int,
        attention_mask: torch.Tensor | None,
        kv_cache: KVCache | None,
        positions: torch.Tensor | None,
    ) -> None:
        if end > self.config.max_seq_len:
            raise ValueError(
                f"forward: sequence end {end} exceeds ModelConfig.max_seq_len = {self.config.max_seq_len}"
            )
        if attention_mask is not None and tuple(attention_mask.shape) != (B, end):
            raise ValueError(
                f"forward: attention_mask has shape {tuple(attention_mask.shape)}, expected {(B, end)} "
                "(batch, cache length + new tokens)"
            )
        if positions is not None and tuple(positions.shape) != (B, T):
            raise ValueError(
                f"forward: positions has shape {tuple(positions.shape)}, expected {(B, T)}"
            )
        if kv_cache is not None:
            if kv_cache.batch_size != B:
                raise ValueError(
                    f"forward: kv_cache holds batch {kv_cache.batch_size}, idx has {B}"
                )
            if end > kv_cache.max_len:
                raise ValueError(f"forward: kv_cache holds {kv_cache.max_len} slots, needs {end}")


def document_positions(document_ids: torch.Tensor) -> torch.Tensor:
    """(B, T) document ids -> (B, T) position of each token within its document (0 at a change)."""
    B, T = document_ids.shape
    idx = torch.arange(T, device=document_ids.device).expand(B, T)
    change = torch.ones_like(document_ids, dtype=torch.bool)
    change[:, 1:] = document_ids[:, 1:] != document_ids[:, :-1]
    starts = torch.where(change, idx, torch.zeros_like(idx)).cummax(dim=1).values  # (B, T)
    return idx - starts


def document_mask(document_ids: torch.Tensor) -> torch.Tensor:
    """(B, T) document ids -> SDPA mask (B, 1, T, T): causal and within the same document
    (block-diagonal causal; each document a contiguous run of one id)."""
    T = document_ids.shape[1]
    slots = torch.arange(T, device=document_ids.device)
    causal = slots[None, :] <= slots[:, None]  # (T, T)
    same = document_ids[:, :, None] == document_ids[:, None, :]  # (B, T, T)
    return (causal[None] & same)[:, None]  # (B, 1, T, T)


def _collect(
    moe: list[MoERecord], mod: list[MoDRecord]
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Sum aux losses over layers; stack detached stats per layer (contract keys)."""
    aux: dict[str, torch.Tensor] = {}
    stats: dict[str, torch.Tensor] = {}
    if moe:
        aux["moe_lb"] = torch.stack([r.lb for r in moe]).sum()
        aux["moe_z"] = torch.stack([r.z for r in moe]).sum()
        stats["moe/tokens_per_expert"] = torch.stack([r.tokens_per_expert for r in moe])
        stats["moe/entropy"] = torch.stack([r.entropy for r in moe])
        stats["moe/dropped_fraction"] = torch.stack([r.dropped_fraction for r in moe])
        stats["moe/max_violation"] = torch.stack([r.max_violation for r in moe])
        stats["moe/router_z"] = torch.stack([r.router_z for r in moe])
    if mod:
        losses = [r.predictor_loss for r in mod if r.predictor_loss is not None]
        if losses:
            aux["mod_predictor"] = torch.stack(losses).sum()
        stats["mod/selected_fraction"] = torch.stack([r.selected_fraction for r in mod])
        stats["mod/predictor_accuracy"] = torch.stack([r.predictor_accuracy for r in mod])
    return aux, stats
