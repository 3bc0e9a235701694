"""Adapters on a Transformer: LoRA (lora.py) and router-weight adapters, saved alone (files.py)."""

from ats_model.adapters.files import (
    load_adapter,
    merge_adapter_into,
    read_adapter_config,
    save_adapter,
    write_adapter,
)
from ats_model.adapters.lora import (
    LoRAConfig,
    apply_lora,
    disabled_adapter,
    lora_state_dict,
    merge_lora,
)

__all__ = [
    "LoRAConfig",
    "apply_lora",
    "disabled_adapter",
    "load_adapter",
    "lora_state_dict",
    "merge_adapter_into",
    "merge_lora",
    "read_adapter_config",
    "save_adapter",
    "write_adapter",
]
