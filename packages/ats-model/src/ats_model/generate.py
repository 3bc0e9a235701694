"""Autoregressive generation with a KV cache: left-padded batches, greedy or sampled decoding.

Sampling order per step (as HF transformers): repetition penalty (CTRL, Keskar et al. 2019) on
every token already in the sequence, then temperature, top-k, top-p (nucleus, Holtzman et al.
2019), then a draw from the seeded generator. temperature == 0 is greedy (argmax).
MoD models decide per token with their causal predictor (causal_routing), never with top-k.
MoE layers run dropless while generating: capacity drops depend on which other tokens share the
batch, so a sequence's output would depend on its batch-mates.
"""

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch

from ats_model.layers.kv_cache import KVCache
from ats_model.model import Transformer


def _check(
    max_new_tokens: int, temperature: float, top_k: int | None, top_p: float | None, rep: float
) -> None:
    if max_new_tokens < 0:
        raise ValueError(f"generate: max_new_tokens = {max_new_tokens} must be >= 0")
    if temperature < 0:
        raise ValueError(f"generate: temperature = {temperature} must be >= 0 (0 = greedy)")
    if top_k is not None and top_k < 1:
        raise ValueError(f"generate: top_k = {top_k} must be >= 1 or None")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"generate: top_p = {top_p} must be in (0, 1] or None")
    if not rep > 0:
        raise ValueError(f"generate: repetition_penalty = {rep} must be > 0")


def _filter(logits: torch.Tensor, top_k: int | None, top_p: float | None) -> torch.Tensor:
    """logits (B, V) with everything outside the top-k / nucleus set to -inf."""
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cum = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
        drop = cum - torch.softmax(sorted_logits, dim=-1) >= top_p  # mass before this token >= p
        drop_orig = torch.zeros_like(drop).scatter(1, order, drop)
        logits = logits.masked_fill(drop_orig, float("-inf"))
    return logits


def _penalize(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """CTRL repetition penalty: seen tokens' positive logits / p, negative ones * p."""
    if penalty == 1.0:
        return logits
    scaled = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, scaled, logits)


@contextmanager
def _generation_mode(model: Transformer) -> Iterator[None]:
    """eval() (no MoE bias updates) and dropless MoE for the duration; restored afterwards."""
    was_training = model.training
    layers = model.moe_layers()
    capacity = [layer.capacity_factor for layer in layers]
    model.eval()
    for layer in layers:
        layer.capacity_factor = None
    try:
        yield
    finally:
        model.train(was_training)
        for layer, cf in zip(layers, capacity, strict=True):
            layer.capacity_factor = cf


@torch.no_grad()
def generate(
    model: Transformer,
    ids: torch.Tensor,
    max_new_tokens: int,
    *,
    attention_mask: torch.Tensor | None = None,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    repetition_penalty: float = 1.0,
    stop_tokens: Sequence[int] = (),
    seed: int | None = None,
    pad_token_id: int = 0,
) -> torch.Tensor:
    """ids (T,) or (B, T) int64, left-padded with attention_mask (B, T) (1 = real token).

    Returns the prompt followed by the new tokens, (B, T + n) (or (T + n,) for a 1-D prompt), where
    n <= max_new_tokens (fewer once every sequence emitted a stop token). A sequence keeps its stop
    token and is filled with pad_token_id after it.
    """
    _check(max_new_tokens, temperature, top_k, top_p, repetition_penalty)
    squeeze = ids.dim() == 1
    ids = ids[None] if squeeze else ids
    if ids.dim() != 2 or ids.shape[1] == 0:
        raise ValueError(
            f"generate: ids must be (T,) or (B, T) with T >= 1, got {tuple(ids.shape)}"
        )
    B, T = ids.shape
    device = ids.device
    mask = (
        torch.ones_like(ids)
        if attention_mask is None
        else attention_mask.to(device=device, dtype=torch.long)
    )
    if tuple(mask.shape) != (B, T):
        raise ValueError(
            f"generate: attention_mask shape {tuple(mask.shape)} != ids shape {(B, T)}"
        )
    dtype = next(model.parameters()).dtype
    cache = KVCache(model.config, B, T + max_new_tokens, device, dtype)
    generator = None if seed is None else torch.Generator(device=device).manual_seed(seed)
    stops = torch.tensor(list(stop_tokens), device=device, dtype=torch.long)
    seen = torch.zeros(B, model.config.vocab_size, dtype=torch.bool, device=device)
    seen.scatter_(1, ids, mask.bool())
    finished = torch.zeros(B, dtype=torch.bool, device=device)

    out = [ids]
    step_ids = ids
    with _generation_mode(model):
        for _ in range(max_new_tokens):
            logits = model(
                step_ids, attention_mask=mask, kv_cache=cache, causal_routing=True
            ).logits
            logits = _penalize(logits[:, -1].float(), seen, repetition_penalty)  # (B, V)
            if temperature == 0:
                nxt = logits.argmax(-1)
            else:
                probs = torch.softmax(_filter(logits / temperature, top_k, top_p), dim=-1)
                nxt = torch.multinomial(probs, 1, generator=generator).squeeze(1)
            nxt = torch.where(finished, torch.full_like(nxt, pad_token_id), nxt)  # (B,)
            seen.scatter_(1, nxt[:, None], ~finished[:, None])
            out.append(nxt[:, None])
            finished = finished | torch.isin(nxt, stops)
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            step_ids = nxt[:, None]
            if bool(finished.all()):
                break
    result = torch.cat(out, dim=1)
    return result[0] if squeeze else result
