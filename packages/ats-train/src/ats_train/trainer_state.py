"""What a checkpoint holds beside the model and the optimizer: the trainer state's format, the RNG
streams and the runtime knobs of MoE / MoD layers (state that is not a module's)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ats_train.checkpoint import CheckpointError, load_tree
from ats_train.checkpoint_sharded import TRAINER_STATE

STATE_VERSION = 3  # 2: the run's attention backend; 3: the orchestrator's last change


def read_trainer_state(checkpoint: Path) -> dict[str, Any]:
    """A checkpoint's trainer state (step, loader, RNG, ...), in the format this ats-train writes."""
    state_dir = checkpoint / TRAINER_STATE
    state = load_tree(state_dir, "state")
    if state["format_version"] != STATE_VERSION:
        raise CheckpointError(
            f"{state_dir}: trainer state format_version {state['format_version']!r}, "
            f"this ats-train reads {STATE_VERSION}"
        )
    return state


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])


_MOE_KNOBS = ("capacity_factor", "temperature", "top_k", "bias_update_rate")
_MOD_KNOBS = ("capacity",)


def runtime_knobs(model: nn.Module) -> dict[str, list[dict[str, Any]]]:
    """The plain attributes an orchestrator may change between steps (model_api.md)."""
    return {
        "moe": [{k: getattr(layer, k) for k in _MOE_KNOBS} for layer in model.moe_layers()],
        "mod": [{k: getattr(layer, k) for k in _MOD_KNOBS} for layer in model.mod_layers()],
    }


def set_runtime_knobs(model: nn.Module, knobs: dict[str, list[dict[str, Any]]]) -> None:
    for kind, layers in (("moe", model.moe_layers()), ("mod", model.mod_layers())):
        if len(knobs[kind]) != len(layers):
            raise CheckpointError(
                f"checkpoint has knobs for {len(knobs[kind])} {kind} layers, model has {len(layers)}"
            )
        for layer, values in zip(layers, knobs[kind], strict=True):
            for name, value in values.items():
                setattr(layer, name, value)
