"""Putting LoRA on a Transformer, taking it off (merge), and switching it off for a while.

Targets are named by the projection's attribute name, the same in every block:
    wq wk wv wo            attention (nn.Linear)
    w1 w3 w2               dense SwiGLU FFN and shared experts (nn.Linear), and the grouped
                           experts' stacked weights (weight-form update, layers/lora.py)
    router                 the MoE router (nn.Linear)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from ats_model.layers.lora import EXPERT_WEIGHTS, ExpertsLoRA, LoRALinear
from ats_model.layers.moe import Experts

LINEAR_TARGETS = ("wq", "wk", "wv", "wo", "w1", "w3", "w2", "router")


@dataclass(frozen=True)
class LoRAConfig:
    rank: int = 8
    alpha: float = 16.0  # the update is scaled by alpha / rank
    dropout: float = 0.0  # on the adapter input of linear targets (not the grouped experts')
    targets: tuple[str, ...] = ("wq", "wk", "wv", "wo")

    def __post_init__(self) -> None:
        if not (isinstance(self.rank, int) and self.rank >= 1):
            raise ValueError(f"lora.rank = {self.rank!r} must be an integer >= 1")
        if not self.alpha > 0:
            raise ValueError(f"lora.alpha = {self.alpha!r} must be > 0")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"lora.dropout = {self.dropout!r} must be in [0, 1)")
        unknown = [t for t in self.targets if t not in LINEAR_TARGETS]
        if not self.targets or unknown:
            raise ValueError(
                f"lora.targets = {list(self.targets)}: expected a non-empty subset of "
                f"{list(LINEAR_TARGETS)}"
            )

    def to_dict(self) -> dict:
        return {
            "rank": self.rank,
            "alpha": self.alpha,
            "dropout": self.dropout,
            "targets": list(self.targets),
        }


def apply_lora(model: nn.Module, config: LoRAConfig) -> list[str]:
    """Put fresh adapters (B = 0: the output is unchanged) on every target of `model`, in place.
    Returns the names of the adapted weights; raises when a target matches nothing."""
    adapted: list[str] = []
    for parent_name, parent in list(model.named_modules()):
        prefix = f"{parent_name}." if parent_name else ""
        if isinstance(parent, Experts):
            names = tuple(t for t in EXPERT_WEIGHTS if t in config.targets)
            if not names:
                continue
            if config.dropout > 0:
                raise ValueError(
                    f"lora.dropout = {config.dropout} with expert targets {list(names)}: the "
                    "grouped experts' update is in weight form, which has no input to drop out; "
                    "set lora.dropout = 0 or leave w1/w3/w2 out of lora.targets"
                )
            if parent.lora is not None:
                raise ValueError(f"apply_lora: {prefix}lora already exists")
            E, F, C = parent.w1.shape
            parent.lora = ExpertsLoRA(
                E, C, F, names, config.rank, config.alpha, parent.w1.device, parent.w1.dtype
            )
            adapted.extend(f"{prefix}{n}" for n in names)
            continue
        for name, child in list(parent.named_children()):
            if name not in config.targets or not isinstance(child, nn.Linear):
                continue
            if isinstance(child, LoRALinear):
                raise ValueError(f"apply_lora: {prefix}{name} already has an adapter")
            setattr(parent, name, LoRALinear(child, config.rank, config.alpha, config.dropout))
            adapted.append(f"{prefix}{name}.weight")
    missing = [t for t in config.targets if not any(_matches(a, t) for a in adapted)]
    if missing:
        raise ValueError(f"lora.targets {missing} match no weight of this model")
    return adapted


def _matches(adapted_name: str, target: str) -> bool:
    parts = adapted_name.split(".")
    return parts[-1] == target or (parts[-1] == "weight" and parts[-2] == target)


def lora_modules(model: nn.Module) -> list[LoRALinear | ExpertsLoRA]:
    return [m for m in model.modules() if isinstance(m, (LoRALinear, ExpertsLoRA))]


def is_lora_param(name: str) -> bool:
    """True for a LoRA parameter's state-dict name (linear `lora_A`/`lora_B`, expert `lora.w1_A`)."""
    parts = name.split(".")
    return parts[-1] in ("lora_A", "lora_B") or (len(parts) >= 2 and parts[-2] == "lora")


def lora_state_dict(model: nn.Module) -> dict:
    """Only the adapter's tensors, by their names in the model."""
    return {k: v for k, v in model.state_dict().items() if is_lora_param(k)}


@contextmanager
def disabled_adapter(model: nn.Module) -> Iterator[nn.Module]:
    """Run `model` as its base weights alone inside the block (the DPO reference under LoRA: no
    second model in memory); every adapter is enabled again on exit, however the block ends."""
    modules = lora_modules(model)
    if not modules:
        raise ValueError("disabled_adapter: the model carries no LoRA adapter")
    states = [m.enabled for m in modules]
    for m in modules:
        m.enabled = False
    try:
        yield model
    finally:
        for m, state in zip(modules, states, strict=True):
            m.enabled = state


def merge_lora(model: nn.Module) -> nn.Module:
    """Add every adapter's update into its base weight and remove the adapters, in place: the
    model is a plain Transformer again, with the state-dict names of the base model."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, LoRALinear):
                plain = nn.Linear(
                    child.in_features, child.out_features, bias=child.bias is not None,
                    device="meta",
                )  # fmt: skip
                plain.weight = child.weight
                plain.bias = child.bias
                plain.weight.data += child.delta_weight().detach().to(plain.weight.dtype)
                setattr(parent, name, plain)
        if isinstance(parent, Experts) and parent.lora is not None:
            for name in parent.lora.targets:
                w = getattr(parent, name)
                w.data += parent.lora.delta_weight(name).detach().to(w.dtype)
            parent.lora = None
    return model


def merged_state_dict(state: dict[str, torch.Tensor], scale: float) -> dict[str, torch.Tensor]:
    """A LoRA model's state dict (as a backend gathers it) -> the base model's, every update
    (scale = alpha / rank) added into its weight: what merge_lora leaves, without the modules."""
    out = {k: v for k, v in state.items() if not is_lora_param(k)}
    for key, A in state.items():
        if key.endswith(".lora_A"):  # linear: <name>.lora_A (r, in), <name>.lora_B (out, r)
            stem = key.removesuffix(".lora_A")
            B, weight = state[f"{stem}.lora_B"], f"{stem}.weight"
            out[weight] = out[weight] + (B @ A * scale).to(out[weight].dtype)
        elif key.split(".")[-2:-1] == ["lora"] and key.endswith("_A"):  # experts.lora.w1_A
            stem, leaf = key.rsplit(".lora.", 1)
            name = leaf.removesuffix("_A")
            B, weight = state[f"{stem}.lora.{name}_B"], f"{stem}.{name}"
            out[weight] = out[weight] + (torch.bmm(B, A) * scale).to(out[weight].dtype)
    return out
