"""export_hf: an ATS model -> an HF transformers directory (LlamaForCausalLM for dense,
MixtralForCausalLM for MoE) that `AutoModelForCausalLM.from_pretrained(dir)` loads with no code.

The export is exact or refused: every knob HF cannot express (MoD, token dropping, router
temperature, un-normalized top-k, bias balancing, shared experts) raises naming the field and value.
"""

import json
from pathlib import Path
from typing import Any

import torch

from ats_model.config import ModelConfig
from ats_model.serialization.hf_llama import llama_config_to_hf, llama_state_to_hf
from ats_model.serialization.hf_mixtral import mixtral_config_to_hf, mixtral_state_to_hf
from ats_model.serialization.model_dir import (
    CONFIG_FILE,
    DEFAULT_MAX_SHARD_BYTES,
    copy_tokenizer,
    model_dtype,
)
from ats_model.serialization.safetensors_io import write_tensors


def _refuse(field: str, value: Any, why: str) -> None:
    raise ValueError(f"export_hf: {field} = {value!r} cannot be exported to HF transformers: {why}")


def check_exportable(model: torch.nn.Module) -> None:
    """Raise on the first config field or runtime knob that HF Llama/Mixtral cannot express."""
    config: ModelConfig = model.config
    if config.mod is not None:
        _refuse("ModelConfig.family", config.family, "Mixture-of-Depths has no HF equivalent")
    if config.moe is None:
        return
    moe = config.moe
    if moe.capacity_factor is not None:
        _refuse("MoEConfig.capacity_factor", moe.capacity_factor, "Mixtral never drops tokens")
    if moe.router_temperature != 1.0:
        _refuse("MoEConfig.router_temperature", moe.router_temperature, "Mixtral softmax has none")
    if not moe.norm_topk:
        _refuse("MoEConfig.norm_topk", moe.norm_topk, "Mixtral renormalizes the top-k weights")
    if moe.bias_update_rate != 0:
        _refuse("MoEConfig.bias_update_rate", moe.bias_update_rate, "Mixtral has no routing bias")
    if moe.n_shared_experts != 0:
        _refuse("MoEConfig.n_shared_experts", moe.n_shared_experts, "Mixtral has no shared experts")
    # The runtime knobs a trainer may have changed since build (contract: plain module attributes).
    for i, layer in enumerate(model.moe_layers()):
        if layer.capacity_factor is not None:
            _refuse(f"moe_layers()[{i}].capacity_factor", layer.capacity_factor, "token dropping")
        if layer.temperature != 1.0:
            _refuse(f"moe_layers()[{i}].temperature", layer.temperature, "router temperature")
        if not layer.norm_topk:
            _refuse(f"moe_layers()[{i}].norm_topk", layer.norm_topk, "top-k renormalization")
        if layer.top_k != moe.top_k:
            _refuse(f"moe_layers()[{i}].top_k", layer.top_k, f"config.json says {moe.top_k}")
        if layer.bias_update_rate != 0:
            _refuse(f"moe_layers()[{i}].bias_update_rate", layer.bias_update_rate, "bias balancing")
        if layer.expert_bias.any():
            _refuse(f"moe_layers()[{i}].expert_bias", "nonzero", "Mixtral has no routing bias")


def export_hf(
    model: torch.nn.Module,
    directory: str | Path,
    tokenizer_json: str | Path | None = None,
    *,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
) -> Path:
    """Write config.json, model.safetensors (HF names) and tokenizer.json; returns the dir."""
    check_exportable(model)
    config: ModelConfig = model.config
    dtype = model_dtype(model)
    state = dict(model.state_dict())
    if config.moe is None:
        hf_config, hf_state = llama_config_to_hf(config, dtype), llama_state_to_hf(state)
    else:
        hf_config, hf_state = mixtral_config_to_hf(config, dtype), mixtral_state_to_hf(state)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / CONFIG_FILE).write_text(json.dumps(hf_config, indent=2) + "\n")
    write_tensors(directory, hf_state, {"format": "pt"}, max_shard_bytes)
    copy_tokenizer(tokenizer_json, directory)
    return directory
