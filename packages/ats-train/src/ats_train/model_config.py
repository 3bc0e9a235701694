"""Which ModelConfig a run trains: a preset, the [model] overrides, and the data's vocabulary.

Also the guard that a resumed run trains the same architecture its checkpoint holds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ats_model import ModelConfig, presets

from ats_train.checkpoint import CheckpointError
from ats_train.config import ConfigError, ModelSection


def build_model_config(model: ModelSection, vocab_size: int, seq_len: int) -> ModelConfig:
    """presets.get(model.preset) with model.overrides applied; vocab_size follows the tokenizer."""
    if model.preset not in presets.names():
        raise ConfigError(
            f"model.preset = {model.preset!r} is not a preset (presets: {', '.join(presets.names())})"
        )
    preset = presets.get(model.preset)
    d = preset.to_dict()
    # Fields the preset derived (head_dim = dim // n_head; n_kv_head = n_head, no GQA) are
    # derived again from an overridden shape: kept, model.n_head=16 on a 768-wide preset would
    # give 16 heads of 64 (not 48) and 12 KV heads (not a divisor of 16).
    changed = model.overrides.keys()
    if "head_dim" not in changed and {"dim", "n_head"} & changed:
        if preset.head_dim == preset.dim // preset.n_head:
            d["head_dim"] = None
    if "n_kv_head" not in changed and "n_head" in changed and preset.n_kv_head == preset.n_head:
        d["n_kv_head"] = None
    for key, value in model.overrides.items():
        head, _, sub = key.partition(".")
        if not sub:
            d[head] = value
        elif d[head] is None:
            raise ConfigError(f"model.{key} is set but preset {model.preset!r} has no {head!r}")
        else:
            d[head] = {**d[head], sub: value}
    if "vocab_size" not in model.overrides:
        d["vocab_size"] = vocab_size
    elif d["vocab_size"] < vocab_size:
        raise ConfigError(
            f"model.vocab_size = {d['vocab_size']} is smaller than the tokenizer's {vocab_size}"
        )
    try:
        config = ModelConfig.from_dict(d)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"[model] preset {model.preset!r} with overrides: {e}") from e
    if config.moe is not None and config.moe.top_k == 1 and config.moe.norm_topk:
        # weight p / p = 1 for every token: d(loss)/d(router) = 0, only the balancing loss trains it
        raise ConfigError(
            "model.moe.top_k = 1 with model.moe.norm_topk = true gives every token the weight 1.0, "
            "so the router gets no gradient from the loss; set model.moe.norm_topk = false "
            "(Switch Transformer: the chosen expert's output scaled by its probability)"
        )
    if config.max_seq_len < seq_len:
        raise ConfigError(
            f"train.seq_len = {seq_len} exceeds the model's max_seq_len = {config.max_seq_len}; "
            f"lower train.seq_len or set model.max_seq_len"
        )
    return config


def _diff(a: Any, b: Any, prefix: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in sorted(set(a) | set(b)):
            out.extend(_diff(a.get(key), b.get(key), f"{prefix}{key}."))
        return out
    return [] if a == b else [f"{prefix.rstrip('.')}: checkpoint {a!r}, this run {b!r}"]


def check_same_model(saved: ModelConfig, current: ModelConfig, checkpoint: Path) -> None:
    """Refuse to resume a checkpoint of another architecture, naming the differing fields."""
    saved_d = {k: v for k, v in saved.to_dict().items() if k != "extra"}
    current_d = {k: v for k, v in current.to_dict().items() if k != "extra"}
    differences = _diff(saved_d, current_d)
    if differences:
        raise CheckpointError(
            f"checkpoint {checkpoint} holds another model shape ({'; '.join(differences[:3])}); "
            f"use another --run-dir or the checkpoint's model config"
        )
