"""ATS MoE <-> HF MixtralForCausalLM tensor names.

Export writes the classic Mixtral checkpoint layout, one tensor per expert, which every transformers
version since 4.36 loads (5.x fuses it on load through its conversion mapping):

    layers.{i}.ffn.router.weight (E, C)   -> model.layers.{i}.block_sparse_moe.gate.weight
    layers.{i}.ffn.experts.w1 (E, F, C)   -> model.layers.{i}.block_sparse_moe.experts.{j}.w1.weight (F, C)
    layers.{i}.ffn.experts.w3 (E, F, C)   -> ... .experts.{j}.w3.weight (F, C)
    layers.{i}.ffn.experts.w2 (E, C, F)   -> ... .experts.{j}.w2.weight (C, F)

Import also reads the fused layout transformers 5.x writes itself:
    model.layers.{i}.mlp.gate.weight (E, C), .mlp.experts.gate_up_proj (E, 2F, C) = cat(w1, w3, dim=1),
    .mlp.experts.down_proj (E, C, F) = w2.
"""

import re
from typing import Any

import torch

from ats_model.config import ModelConfig, MoEConfig
from ats_model.serialization.hf_llama import (
    HF_LAYER,
    llama_config_fields,
    llama_config_to_hf,
    rename_from_hf,
    rename_to_hf,
    require_key,
)

ATS_MOE_KEY = re.compile(r"layers\.(\d+)\.ffn\.(router\.weight|experts\.w[123]|expert_bias)")
HF_EXPERT_KEY = re.compile(
    r"model\.layers\.(\d+)\.block_sparse_moe\.experts\.(\d+)\.(w[123])\.weight"
)
HF_ROUTER_KEY = re.compile(r"model\.layers\.(\d+)\.block_sparse_moe\.gate\.weight")
HF_FUSED_KEY = re.compile(
    r"model\.layers\.(\d+)\.mlp\.(gate\.weight|experts\.gate_up_proj|experts\.down_proj)"
)


def mixtral_state_to_hf(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """MoE ATS state dict -> MixtralForCausalLM names (experts unstacked). The caller has checked
    that expert_bias is zero (HF has no selection bias), so it is dropped."""
    out = {}
    for key, t in state.items():
        m = ATS_MOE_KEY.fullmatch(key)
        if m is None:
            hf_key = rename_to_hf(key, HF_LAYER)
            if hf_key is None:
                raise ValueError(f"export_hf: tensor {key} has no MixtralForCausalLM counterpart")
            out[hf_key] = t
            continue
        i, name = m.groups()
        prefix = f"model.layers.{i}.block_sparse_moe"
        if name == "router.weight":
            out[f"{prefix}.gate.weight"] = t
        elif name != "expert_bias":
            w = name.removeprefix("experts.")
            for j in range(t.shape[0]):
                # clone: safetensors refuses views sharing one storage
                out[f"{prefix}.experts.{j}.{w}.weight"] = t[j].clone()
    return out


def unfuse_mixtral(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename the transformers 5.x fused expert layout to the classic per-expert one (views, no
    copy); classic names pass through unchanged."""
    out = {}
    for key, t in state.items():
        m = HF_FUSED_KEY.fullmatch(key)
        if m is None:
            out[key] = t
            continue
        i, name = m.groups()
        prefix = f"model.layers.{i}.block_sparse_moe"
        if name == "gate.weight":
            out[f"{prefix}.gate.weight"] = t
            continue
        if name == "experts.down_proj":
            per_expert = {"w2": t}  # (E, C, F)
        else:
            w1, w3 = t.chunk(2, dim=1)  # gate_up_proj (E, 2F, C): gate rows first, then up rows
            per_expert = {"w1": w1, "w3": w3}
        for w, stacked in per_expert.items():
            for j, expert in enumerate(stacked.unbind(0)):
                out[f"{prefix}.experts.{j}.{w}.weight"] = expert
    return out


def mixtral_state_from_hf(state: dict[str, torch.Tensor], source: str) -> dict[str, torch.Tensor]:
    """Classic MixtralForCausalLM names -> MoE ATS state dict without expert_bias (the caller sets
    it to zero). The caller has checked names and shapes, so experts 0..E-1 are all present."""
    out: dict[str, torch.Tensor] = {}
    experts: dict[tuple[str, str], dict[int, torch.Tensor]] = {}
    for key, t in state.items():
        if m := HF_EXPERT_KEY.fullmatch(key):
            i, j, w = m.groups()
            experts.setdefault((i, w), {})[int(j)] = t
        elif m := HF_ROUTER_KEY.fullmatch(key):
            out[f"layers.{m.group(1)}.ffn.router.weight"] = t
        else:
            ats_key = rename_from_hf(key, HF_LAYER)
            if ats_key is None:
                raise ValueError(f"{source}: unexpected tensor {key} for MixtralForCausalLM")
            out[ats_key] = t
    for (i, w), by_index in experts.items():
        # (E, F, C) for w1/w3, (E, C, F) for w2
        out[f"layers.{i}.ffn.experts.{w}"] = torch.stack(
            [by_index[j] for j in range(len(by_index))]
        )
    return out


def mixtral_config_to_hf(config: ModelConfig, dtype: torch.dtype) -> dict[str, Any]:
    """MixtralConfig fields for an exportable MoE config (the caller has refused the rest)."""
    hf = llama_config_to_hf(config, dtype)
    for key in ("mlp_bias", "attention_bias"):  # Llama-only fields
        del hf[key]
    hf.update(
        architectures=["MixtralForCausalLM"],
        model_type="mixtral",
        num_local_experts=config.moe.n_experts,
        num_experts_per_tok=config.moe.top_k,
        sliding_window=None,
        router_jitter_noise=0.0,
        output_router_logits=False,
        router_aux_loss_coef=0.0,
    )
    return hf


def mixtral_config_fields(hf: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig fields (with `moe`) of a MixtralConfig; a sliding window shorter than the context
    is refused (ATS attention is full causal)."""
    fields = llama_config_fields(hf, default_theta=1e6)  # MixtralConfig.default_theta
    window = hf.get("sliding_window")
    if window is not None and window < fields["max_seq_len"]:
        raise ValueError(
            f"config.json: sliding_window = {window} cannot be imported into ATS (allowed: null or "
            f">= max_position_embeddings {fields['max_seq_len']}): ATS attention is full causal"
        )
    moe = MoEConfig(
        n_experts=require_key(hf, "num_local_experts"), top_k=require_key(hf, "num_experts_per_tok")
    )
    return {**fields, "family": "moe", "moe": moe}
