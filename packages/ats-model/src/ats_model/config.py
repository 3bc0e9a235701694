"""ModelConfig: the architecture of one ATS model (nothing about training), validated on creation.

A typed dataclass tree: the shared fields every family uses, plus `moe` (MoEConfig) and `mod`
(MoDConfig) sub-configs that only the families needing them carry. `to_dict()` / `from_dict()`
give the versioned JSON form stored as config.json in a model directory.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from dataclasses import dataclass
from typing import Any

FORMAT_VERSION = 1
FAMILIES = ("dense", "moe", "mod", "hybrid")  # registered in ats_model.families
MOD_ROUTINGS = ("learned", "static", "random")
MOD_PLACEMENTS = ("all", "later_half", "every_n")


def _fail(owner: str, name: str, value: Any, expected: str) -> None:
    raise ValueError(f"{owner}.{name} = {value!r} is invalid: expected {expected}")


def _check_keys(owner: str, cls: type, data: dict[str, Any]) -> None:
    known = {f.name for f in dataclasses.fields(cls)}
    for key in data:
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"{owner}: unknown field {key!r}{hint}; known: {sorted(known)}")


@dataclass
class RopeScaling:
    """Llama-3.1 frequency scaling for contexts longer than the one the model was trained on."""

    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_seq_len: int = 8192

    def __post_init__(self) -> None:
        if not self.factor >= 1.0:
            _fail("RopeScaling", "factor", self.factor, "a float >= 1")
        if not 0 < self.low_freq_factor < self.high_freq_factor:
            _fail(
                "RopeScaling",
                "low_freq_factor",
                self.low_freq_factor,
                f"0 < low_freq_factor < high_freq_factor ({self.high_freq_factor})",
            )
        if self.original_max_seq_len < 1:
            _fail("RopeScaling", "original_max_seq_len", self.original_max_seq_len, "an int >= 1")


@dataclass
class MoEConfig:
    """Mixture-of-Experts FFN: a linear router over `n_experts` SwiGLU experts of width ffn_dim."""

    n_experts: int = 8
    top_k: int = 2
    capacity_factor: float | None = None  # None = dropless
    router_temperature: float = 1.0
    norm_topk: bool = True  # renormalize the top-k weights to sum to 1 (Mixtral)
    n_shared_experts: int = 0  # always-on experts, fused into one SwiGLU of width n * ffn_dim
    bias_update_rate: float = 0.0  # DeepSeek-V3 aux-loss-free balancing; 0 = off

    def __post_init__(self) -> None:
        if self.n_experts < 1:
            _fail("MoEConfig", "n_experts", self.n_experts, "an int >= 1")
        if not 1 <= self.top_k <= self.n_experts:
            _fail("MoEConfig", "top_k", self.top_k, f"1 <= top_k <= n_experts ({self.n_experts})")
        if self.capacity_factor is not None and not self.capacity_factor > 0:
            _fail("MoEConfig", "capacity_factor", self.capacity_factor, "None (dropless) or > 0")
        if not self.router_temperature > 0:
            _fail("MoEConfig", "router_temperature", self.router_temperature, "a float > 0")
        if self.n_shared_experts < 0:
            _fail("MoEConfig", "n_shared_experts", self.n_shared_experts, "an int >= 0")
        if self.bias_update_rate < 0:
            _fail("MoEConfig", "bias_update_rate", self.bias_update_rate, "a float >= 0")


@dataclass
class MoDConfig:
    """Mixture-of-Depths (Raposo et al. 2024): which blocks route, and how."""

    capacity: float = 0.125  # fraction of each sequence's tokens a routed block processes
    routing: str = "learned"  # learned | static | random
    placement: str = "every_n"  # all | later_half | every_n
    every_n: int = 2  # with placement every_n: blocks 1, 1+n, 1+2n, ... route (paper: every other)
    predictor_dim: int = 64  # hidden width of the causal predictor MLP (learned routing only)
    seed: int = 0  # random routing: seed of the per-position hash

    def __post_init__(self) -> None:
        if not 0 < self.capacity <= 1:
            _fail("MoDConfig", "capacity", self.capacity, "0 < capacity <= 1")
        if self.routing not in MOD_ROUTINGS:
            _fail("MoDConfig", "routing", self.routing, f"one of {MOD_ROUTINGS}")
        if self.placement not in MOD_PLACEMENTS:
            _fail("MoDConfig", "placement", self.placement, f"one of {MOD_PLACEMENTS}")
        if self.every_n < 1:
            _fail("MoDConfig", "every_n", self.every_n, "an int >= 1")
        if self.predictor_dim < 1:
            _fail("MoDConfig", "predictor_dim", self.predictor_dim, "an int >= 1")

    def routes_layer(self, layer_idx: int, n_layer: int) -> bool:
        if self.placement == "all":
            return True
        if self.placement == "later_half":
            return layer_idx >= n_layer // 2
        return layer_idx % self.every_n == self.every_n - 1


@dataclass
class ModelConfig:
    """Llama-style decoder: RMSNorm, RoPE (half-split), GQA attention, SwiGLU/MoE FFN, optional MoD."""

    family: str = "dense"  # dense | moe | mod | hybrid (MoD around MoE blocks)
    vocab_size: int = 32000
    dim: int = 4096
    n_layer: int = 32
    n_head: int = 32
    n_kv_head: int | None = None  # None -> n_head (plain multi-head attention)
    head_dim: int | None = None  # None -> dim // n_head
    ffn_dim: int = 11008  # SwiGLU hidden width (per expert for MoE)
    max_seq_len: int = 4096
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    init_std: float = 0.02
    # training-time regularizer on embeddings, attention weights and both residual branches
    # (nanoGPT's placement); inference ignores it, so exports and the native runtime do too
    dropout: float = 0.0
    # dropout on the SwiGLU hidden activations (silu(w1 x) * w3 x) of the dense FFN and of every
    # routed and shared expert: Switch Transformer's "expert dropout" (Fedus et al. 2021, sec. 4.1)
    # regularizes the capacity an MoE adds; training only, like `dropout`
    ffn_dropout: float = 0.0
    moe: MoEConfig | None = None
    mod: MoDConfig | None = None

    def __post_init__(self) -> None:
        if isinstance(self.rope_scaling, dict):
            self.rope_scaling = RopeScaling(**self.rope_scaling)
        if isinstance(self.moe, dict):
            self.moe = MoEConfig(**self.moe)
        if isinstance(self.mod, dict):
            self.mod = MoDConfig(**self.mod)
        if self.n_kv_head is None:
            self.n_kv_head = self.n_head
        if self.head_dim is None and self.n_head > 0:
            self.head_dim = self.dim // self.n_head
        self.validate()

    def validate(self) -> None:
        o = "ModelConfig"
        if self.family not in FAMILIES:
            close = difflib.get_close_matches(str(self.family), FAMILIES, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            _fail(o, "family", self.family, f"one of {FAMILIES}{hint}")
        for name in (
            "vocab_size",
            "dim",
            "n_layer",
            "n_head",
            "n_kv_head",
            "ffn_dim",
            "max_seq_len",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                _fail(o, name, value, "an int >= 1")
        if self.n_head % self.n_kv_head != 0:
            _fail(o, "n_kv_head", self.n_kv_head, f"a divisor of n_head ({self.n_head})")
        if self.head_dim is None or self.head_dim < 2 or self.head_dim % 2 != 0:
            _fail(o, "head_dim", self.head_dim, "an even int >= 2 (RoPE rotates pairs)")
        if not self.rope_theta > 0:
            _fail(o, "rope_theta", self.rope_theta, "a float > 0")
        if not self.norm_eps > 0:
            _fail(o, "norm_eps", self.norm_eps, "a float > 0")
        if not self.init_std > 0:
            _fail(o, "init_std", self.init_std, "a float > 0")
        for name in ("dropout", "ffn_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                _fail(o, name, getattr(self, name), "a float in [0, 1)")
        needs_moe = self.family in ("moe", "hybrid")
        needs_mod = self.family in ("mod", "hybrid")
        if needs_moe != (self.moe is not None):
            want = "a MoEConfig" if needs_moe else "None"
            _fail(o, "moe", self.moe, f"{want} for family {self.family!r}")
        if needs_mod != (self.mod is not None):
            want = "a MoDConfig" if needs_mod else "None"
            _fail(o, "mod", self.mod, f"{want} for family {self.family!r}")
        if self.mod is not None and not any(
            self.mod.routes_layer(i, self.n_layer) for i in range(self.n_layer)
        ):
            _fail(
                o,
                "mod.placement",
                self.mod.placement,
                f"a placement routing >= 1 of {self.n_layer} layers",
            )

    # ---- derived sizes -------------------------------------------------------------------
    @property
    def n_rep(self) -> int:
        """Query heads per KV head (GQA group size)."""
        return self.n_head // self.n_kv_head

    def is_mod_layer(self, layer_idx: int) -> bool:
        return self.mod is not None and self.mod.routes_layer(layer_idx, self.n_layer)

    # ---- serialization -------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["format_version"] = FORMAT_VERSION
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        data = dict(data)
        version = data.pop("format_version", None)
        if version != FORMAT_VERSION:
            raise ValueError(
                f"ModelConfig.format_version = {version!r} is not supported: expected {FORMAT_VERSION}"
            )
        _check_keys("ModelConfig", cls, data)
        for key, sub in (("rope_scaling", RopeScaling), ("moe", MoEConfig), ("mod", MoDConfig)):
            if isinstance(data.get(key), dict):
                _check_keys(f"ModelConfig.{key}", sub, data[key])
        return cls(**data)


def mod_top_k(capacity: float, seq_len: int) -> int:
    """ceil(capacity * T) clamped to [1, T]; rounded first so 0.3 * 10 gives 3, not 4."""
    return max(1, min(seq_len, math.ceil(round(capacity * seq_len, 6))))
