"""train.trainable: which parameters a run trains, decided when the model is built (before the
optimizer, which takes only parameters that require grad, and before any wrapper).

    all      every parameter
    lora     LoRA adapters from [lora] on every target; every base weight frozen
    routers  the MoE routers' weights; everything else frozen
"""

from __future__ import annotations

from ats_model.adapters import LoRAConfig, apply_lora
from ats_model.adapters.lora import is_lora_param
from torch import nn

from ats_train.config import ConfigError, TrainConfig


def lora_config(config: TrainConfig) -> LoRAConfig:
    section = config.lora
    try:
        return LoRAConfig(
            rank=section.rank,
            alpha=section.alpha,
            dropout=section.dropout,
            targets=tuple(section.targets),
        )
    except ValueError as e:
        raise ConfigError(str(e)) from e


def is_router_param(name: str) -> bool:
    return name.endswith(".router.weight")


def apply_trainable(model: nn.Module, config: TrainConfig) -> str:
    """Set requires_grad per train.trainable (adding the LoRA adapters first); returns a line
    saying how many parameters train."""
    mode = config.train.trainable
    if mode == "all":
        trains = None
    elif mode == "lora":
        try:
            apply_lora(model, lora_config(config))
        except ValueError as e:
            raise ConfigError(str(e)) from e
        trains = is_lora_param
    else:
        if not model.moe_layers():
            raise ConfigError(
                f"train.trainable = 'routers' needs an MoE model; {config.model.preset!r} "
                f"({model.config.family}) has no router"
            )
        trains = is_router_param
    total = trainable = 0
    for name, p in model.named_parameters():
        if trains is not None:
            p.requires_grad_(trains(name))
        total += p.numel()
        trainable += p.numel() if p.requires_grad else 0
    return f"trainable: {mode}, {trainable:,} of {total:,} parameters ({trainable / total:.2%})"
