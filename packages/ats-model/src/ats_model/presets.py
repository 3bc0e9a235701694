"""Named model configurations, from CPU toys to 300B-class, as small functions.

Names are "<size>-<family>": sizes tiny, 20m, 124m, 1b, 7b, 10b, 70b, 300b; families dense, moe,
mod, hybrid. A size function gives the dense shape; the family variant adds MoE (8-64 experts) and/or
MoD. The size names the compute class: MoE variants keep about the dense model's ACTIVE parameters
(so "124m-moe" vs "124m-dense" is an equal-compute comparison) and multiply the total; MoD variants
keep the parameters and cut the FLOPs. Two reference shapes, "llama2-7b" and "mixtral-8x7b",
reproduce the published models.
"""

import dataclasses
import difflib
from collections.abc import Callable

from ats_model.config import MoDConfig, ModelConfig, MoEConfig


def _tiny() -> ModelConfig:
    # a training step in well under a second on one CPU core
    return ModelConfig(
        vocab_size=512,
        dim=64,
        n_layer=2,
        n_head=4,
        n_kv_head=2,
        ffn_dim=128,
        max_seq_len=256,
        tie_embeddings=True,
    )


def _20m() -> ModelConfig:
    return ModelConfig(
        vocab_size=32000,
        dim=384,
        n_layer=6,
        n_head=6,
        ffn_dim=1024,
        max_seq_len=1024,
        tie_embeddings=True,
    )


def _124m() -> ModelConfig:
    # GPT-2 small shape (vocab padded to 50304) with a SwiGLU FFN of equal parameter count
    return ModelConfig(
        vocab_size=50304,
        dim=768,
        n_layer=12,
        n_head=12,
        ffn_dim=2048,
        max_seq_len=1024,
        tie_embeddings=True,
    )


def _1b() -> ModelConfig:
    # Llama-3.2-1B shape
    return ModelConfig(
        vocab_size=128256,
        dim=2048,
        n_layer=16,
        n_head=32,
        n_kv_head=8,
        ffn_dim=8192,
        max_seq_len=8192,
        rope_theta=500000.0,
        tie_embeddings=True,
    )


def _7b() -> ModelConfig:
    return llama2_7b()


def _10b() -> ModelConfig:
    # Llama-3-style 8B width (GQA 32/8, SwiGLU 14336) at 42 layers with Llama 2's 32k vocabulary,
    # untied: 9.42B parameters, whose mixed-precision AdamW state (~16 bytes/param, 151 GB) does
    # not fit one 141 GB H200; benchmarks/offload.py trains it with ZeRO-3 offload (issue 6).
    return ModelConfig(
        vocab_size=32000,
        dim=4096,
        n_layer=42,
        n_head=32,
        n_kv_head=8,
        ffn_dim=14336,
        max_seq_len=4096,
        rope_theta=500000.0,
    )


def _70b() -> ModelConfig:
    # Llama-2-70B shape
    return ModelConfig(
        vocab_size=32000,
        dim=8192,
        n_layer=80,
        n_head=64,
        n_kv_head=8,
        ffn_dim=28672,
        max_seq_len=4096,
    )


def _300b() -> ModelConfig:
    return ModelConfig(
        vocab_size=128256,
        dim=16384,
        n_layer=96,
        n_head=128,
        n_kv_head=16,
        ffn_dim=53248,
        max_seq_len=8192,
        rope_theta=500000.0,
    )


def llama2_7b() -> ModelConfig:
    return ModelConfig(
        vocab_size=32000, dim=4096, n_layer=32, n_head=32, ffn_dim=11008, max_seq_len=4096
    )


def mixtral_8x7b() -> ModelConfig:
    return ModelConfig(
        family="moe",
        vocab_size=32000,
        dim=4096,
        n_layer=32,
        n_head=32,
        n_kv_head=8,
        ffn_dim=14336,
        max_seq_len=32768,
        rope_theta=1e6,
        moe=MoEConfig(n_experts=8, top_k=2),
    )


# (n_experts, top_k, shared experts); each expert is ffn_dim / (top_k + shared) wide, so the
# active FFN equals the dense one
_MOE_SHAPE = {
    "tiny": (8, 2, 0),
    "20m": (8, 2, 0),
    "124m": (8, 2, 0),
    "1b": (16, 2, 0),
    "7b": (8, 2, 0),
    "10b": (8, 2, 0),
    "70b": (32, 4, 1),
    "300b": (64, 8, 1),
}


def _moe(base: ModelConfig, size: str) -> ModelConfig:
    n_experts, top_k, shared = _MOE_SHAPE[size]
    ffn = max(8, base.ffn_dim // (top_k + shared) // 8 * 8)
    moe = MoEConfig(n_experts=n_experts, top_k=top_k, n_shared_experts=shared)
    return dataclasses.replace(base, family="moe", ffn_dim=ffn, moe=moe)


def _mod(base: ModelConfig) -> ModelConfig:
    # the paper's best setting: every other block routed, 12.5% capacity
    mod = MoDConfig(capacity=0.125, routing="learned", placement="every_n", every_n=2)
    return dataclasses.replace(base, family="mod", mod=mod)


def _hybrid(base: ModelConfig, size: str) -> ModelConfig:
    moe = _moe(base, size)
    return dataclasses.replace(moe, family="hybrid", mod=_mod(base).mod)


def _tiny_mod() -> ModelConfig:
    # capacity 0.5 so a 2-layer toy still routes a meaningful share of tokens
    mod = MoDConfig(capacity=0.5, placement="every_n", every_n=2, predictor_dim=16)
    return dataclasses.replace(_tiny(), family="mod", mod=mod)


def _tiny_hybrid() -> ModelConfig:
    return dataclasses.replace(_moe(_tiny(), "tiny"), family="hybrid", mod=_tiny_mod().mod)


_SIZES: dict[str, Callable[[], ModelConfig]] = {
    "tiny": _tiny,
    "20m": _20m,
    "124m": _124m,
    "1b": _1b,
    "7b": _7b,
    "10b": _10b,
    "70b": _70b,
    "300b": _300b,
}


def _variant(size: str, family: str) -> Callable[[], ModelConfig]:
    def make() -> ModelConfig:
        base = _SIZES[size]()
        if family == "dense":
            return base
        if family == "moe":
            return _moe(base, size)
        if size == "tiny":
            return _tiny_mod() if family == "mod" else _tiny_hybrid()
        return _mod(base) if family == "mod" else _hybrid(base, size)

    return make


_PRESETS: dict[str, Callable[[], ModelConfig]] = {
    f"{size}-{family}": _variant(size, family)
    for size in _SIZES
    for family in ("dense", "moe", "mod", "hybrid")
}
_PRESETS["llama2-7b"] = llama2_7b
_PRESETS["mixtral-8x7b"] = mixtral_8x7b


def names() -> list[str]:
    return sorted(_PRESETS)


def get(name: str) -> ModelConfig:
    """A fresh ModelConfig for preset `name`; unknown names raise with the closest suggestion."""
    if name not in _PRESETS:
        close = difflib.get_close_matches(name, names(), n=3)
        hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        raise KeyError(f"unknown model preset {name!r}{hint} (see ats_model.presets.names())")
    return _PRESETS[name]()
