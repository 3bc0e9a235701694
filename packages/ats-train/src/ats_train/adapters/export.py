"""What a run with train.trainable = lora | routers writes at its end besides run_dir/model:
run_dir/adapter, the adapter alone (ats_model adapters/files.py). run_dir/model is then the plain
base architecture: LoRA updates merged into their weights, so ats-infer and HF export read it."""

from __future__ import annotations

from pathlib import Path

import torch
from ats_model.adapters import write_adapter
from ats_model.adapters.files import adapter_tensors
from ats_model.adapters.lora import merged_state_dict
from torch import nn

from ats_train.adapters.trainable import lora_config
from ats_train.config import TrainConfig

ADAPTER_DIR = "adapter"


def export_adapter(
    config: TrainConfig, model: nn.Module, state: dict[str, torch.Tensor], run_dir: Path
) -> dict[str, torch.Tensor]:
    """Write run_dir/adapter (main rank) when the run trains one; returns the state dict for
    run_dir/model (LoRA merged, so the base architecture's names)."""
    mode = config.train.trainable
    if mode == "all":
        return state
    out = run_dir / ADAPTER_DIR
    if mode == "routers":
        write_adapter(model.config, adapter_tensors(state, "routers"), out, "routers")
        return state
    lora = lora_config(config)
    write_adapter(model.config, adapter_tensors(state, "lora"), out, "lora", lora)
    return merged_state_dict(state, lora.alpha / lora.rank)
