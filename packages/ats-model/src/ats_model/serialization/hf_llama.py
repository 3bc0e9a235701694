"""ATS <-> HF LlamaForCausalLM tensor names (the parts every HF export shares: embeddings,
attention, norms, head) and the dense SwiGLU FFN.

ATS uses HF's half-split RoPE and repeat_kv head order, so q/k need no permutation: every tensor maps
one to one, bit for bit.
"""

import re
from typing import Any

import torch

from ats_model.config import ModelConfig, RopeScaling

HF_GLOBAL = {
    "tok_embeddings.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
HF_LAYER = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn.wq.weight": "self_attn.q_proj.weight",
    "attn.wk.weight": "self_attn.k_proj.weight",
    "attn.wv.weight": "self_attn.v_proj.weight",
    "attn.wo.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
}
HF_DENSE_FFN = {
    "ffn.w1.weight": "mlp.gate_proj.weight",
    "ffn.w3.weight": "mlp.up_proj.weight",
    "ffn.w2.weight": "mlp.down_proj.weight",
}

ATS_LAYER_KEY = re.compile(r"layers\.(\d+)\.(.+)")
HF_LAYER_KEY = re.compile(r"model\.layers\.(\d+)\.(.+)")


def rename_to_hf(key: str, layer_table: dict[str, str]) -> str | None:
    """HF name of the ATS tensor `key`, or None when neither table knows it."""
    if key in HF_GLOBAL:
        return HF_GLOBAL[key]
    m = ATS_LAYER_KEY.fullmatch(key)
    if m and m.group(2) in layer_table:
        return f"model.layers.{m.group(1)}.{layer_table[m.group(2)]}"
    return None


def rename_from_hf(key: str, layer_table: dict[str, str]) -> str | None:
    """ATS name of the HF tensor `key`, or None when neither table knows it."""
    inverse_global = {v: k for k, v in HF_GLOBAL.items()}
    if key in inverse_global:
        return inverse_global[key]
    m = HF_LAYER_KEY.fullmatch(key)
    inverse_layer = {v: k for k, v in layer_table.items()}
    if m and m.group(2) in inverse_layer:
        return f"layers.{m.group(1)}.{inverse_layer[m.group(2)]}"
    return None


def llama_state_to_hf(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Dense ATS state dict -> LlamaForCausalLM names; an unknown name is an error."""
    table = {**HF_LAYER, **HF_DENSE_FFN}
    out = {}
    for key, t in state.items():
        hf_key = rename_to_hf(key, table)
        if hf_key is None:
            raise ValueError(f"export_hf: tensor {key} has no LlamaForCausalLM counterpart")
        out[hf_key] = t
    return out


def llama_state_from_hf(state: dict[str, torch.Tensor], source: str) -> dict[str, torch.Tensor]:
    """LlamaForCausalLM names -> dense ATS state dict; an unknown name is an error."""
    table = {**HF_LAYER, **HF_DENSE_FFN}
    out = {}
    for key, t in state.items():
        ats_key = rename_from_hf(key, table)
        if ats_key is None:
            raise ValueError(f"{source}: unexpected tensor {key} for LlamaForCausalLM")
        out[ats_key] = t
    return out


def llama_config_to_hf(config: ModelConfig, dtype: torch.dtype) -> dict[str, Any]:
    """LlamaConfig fields for an exportable ATS config (the caller has refused the rest)."""
    hf: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": config.vocab_size,
        "hidden_size": config.dim,
        "intermediate_size": config.ffn_dim,
        "num_hidden_layers": config.n_layer,
        "num_attention_heads": config.n_head,
        "num_key_value_heads": config.n_kv_head,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": config.max_seq_len,
        "initializer_range": config.init_std,
        "rms_norm_eps": config.norm_eps,
        "rope_theta": config.rope_theta,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "tie_word_embeddings": config.tie_embeddings,
        "use_cache": True,
        "bos_token_id": None,
        "eos_token_id": None,
        "torch_dtype": str(dtype).removeprefix("torch."),
    }
    if config.rope_scaling is not None:
        # The legacy top-level `rope_scaling` dict: transformers 4.45+ reads it, 5.x converts it.
        s = config.rope_scaling
        hf["rope_scaling"] = {
            "rope_type": "llama3",
            "factor": s.factor,
            "low_freq_factor": s.low_freq_factor,
            "high_freq_factor": s.high_freq_factor,
            "original_max_position_embeddings": s.original_max_seq_len,
        }
    return hf


def require_key(hf: dict[str, Any], key: str) -> Any:
    if key not in hf:
        raise ValueError(f"config.json: missing key {key!r}")
    return hf[key]


def _refuse_unless(hf: dict[str, Any], key: str, allowed: tuple[Any, ...], why: str) -> None:
    if hf.get(key, allowed[0]) not in allowed:
        raise ValueError(
            f"config.json: {key} = {hf[key]!r} cannot be imported into ATS (allowed: "
            f"{', '.join(map(repr, allowed))}): {why}"
        )


def _rope_from_hf(hf: dict[str, Any], default_theta: float) -> tuple[float, RopeScaling | None]:
    """rope_theta and Llama-3.1 scaling from either the 4.x (rope_theta + rope_scaling) or the 5.x
    (rope_parameters) form of config.json."""
    params = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    theta = params.get("rope_theta", hf.get("rope_theta", default_theta))
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        return float(theta), None
    if kind != "llama3":
        raise ValueError(
            f"config.json: rope type {kind!r} cannot be imported into ATS (allowed: 'default', "
            "'llama3'): ATS implements only Llama-3.1 frequency scaling"
        )
    keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    for key in keys:
        if key not in params:
            raise ValueError(f"config.json: llama3 rope scaling lacks {key!r}")
    scaling = RopeScaling(
        factor=float(params["factor"]),
        low_freq_factor=float(params["low_freq_factor"]),
        high_freq_factor=float(params["high_freq_factor"]),
        original_max_seq_len=int(params["original_max_position_embeddings"]),
    )
    return float(theta), scaling


def llama_config_fields(hf: dict[str, Any], default_theta: float) -> dict[str, Any]:
    """ModelConfig fields shared by Llama and Mixtral configs; features ATS lacks are refused.

    Optional keys take the defaults transformers itself uses when config.json omits them."""
    _refuse_unless(hf, "hidden_act", ("silu",), "ATS FFNs are SwiGLU")
    _refuse_unless(hf, "attention_bias", (False,), "ATS attention has no biases")
    _refuse_unless(hf, "mlp_bias", (False,), "ATS FFNs have no biases")
    n_head = require_key(hf, "num_attention_heads")
    dim = require_key(hf, "hidden_size")
    theta, scaling = _rope_from_hf(hf, default_theta)
    return {
        "vocab_size": require_key(hf, "vocab_size"),
        "dim": dim,
        "n_layer": require_key(hf, "num_hidden_layers"),
        "n_head": n_head,
        "n_kv_head": hf.get("num_key_value_heads") or n_head,
        "head_dim": hf.get("head_dim") or dim // n_head,
        "ffn_dim": require_key(hf, "intermediate_size"),
        "max_seq_len": require_key(hf, "max_position_embeddings"),
        "rope_theta": theta,
        "rope_scaling": scaling,
        "norm_eps": float(require_key(hf, "rms_norm_eps")),
        "tie_embeddings": bool(hf.get("tie_word_embeddings", False)),
        "init_std": float(hf.get("initializer_range", 0.02)),
    }
