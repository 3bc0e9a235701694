"""train.precision = "fp8": the Linear layers' GEMMs in float8 through torchao (Micikevicius et al.
2022, "FP8 Formats for Deep Learning"), the rest under bf16 autocast, as torchtitan's float8
converter does. Recipes: "tensorwise" (one dynamic scale per tensor) and "rowwise" (one per row,
more accurate, slower casts). Needs a GPU with FP8 tensor cores (compute capability >= 8.9: Ada,
Hopper or later) and torchao (the `fp8` extra of ats-train).

What stays in bf16: the LM head (the fused loss reads its weight directly, and its accuracy costs
the most), the MoE and MoD routers and the MoD predictor (narrow outputs, a few FLOPs), and the MoE
experts: torchao's float8 grouped GEMM (prototype.moe_training) works by intercepting
torch._grouped_mm on its own tensor subclass, and ATS experts run through ats_kernels' own grouped
GEMM (grouped_mlp), which that subclass never sees.
"""

from __future__ import annotations

import importlib.util

import torch
from torch import nn

FP8_MIN_CAPABILITY = (8, 9)
# torchao's float8 GEMM (torch._scaled_mm) needs both dimensions to be multiples of 16
_FP8_DIM_MULTIPLE = 16


def check_fp8_device(device: torch.device) -> None:
    """Raise ValueError unless `device` is a GPU with FP8 tensor cores and torchao is installed."""
    if device.type != "cuda":
        raise ValueError(
            f"train.precision = 'fp8' needs a CUDA GPU with FP8 tensor cores (compute capability "
            f">= 8.9: Ada, Hopper or later); this run's device is {device.type}"
        )
    capability = torch.cuda.get_device_capability(device)
    if capability < FP8_MIN_CAPABILITY:
        raise ValueError(
            f"train.precision = 'fp8' needs compute capability >= 8.9 (Ada, Hopper or later); "
            f"{torch.cuda.get_device_name(device)} has {capability[0]}.{capability[1]}"
        )
    if importlib.util.find_spec("torchao") is None:
        raise ValueError(
            "train.precision = 'fp8' needs torchao (pip install 'ats-train[fp8]'), which is not "
            "installed"
        )


def fp8_linear_filter(module: nn.Module, fqn: str) -> bool:
    """Whether the Linear at `fqn` runs in float8 (module docstring: what stays in bf16)."""
    if not isinstance(module, nn.Linear):
        return False
    name = fqn.rsplit(".", 1)[-1]
    if name in ("output", "router", "mod_router", "w_in", "w_out"):
        return False
    return (
        module.in_features % _FP8_DIM_MULTIPLE == 0 and module.out_features % _FP8_DIM_MULTIPLE == 0
    )


def apply_fp8(model: nn.Module, recipe: str) -> list[str]:
    """Swap the chosen Linear layers for torchao's Float8Linear in place (same parameters, same
    names, so checkpoints do not change); returns the converted layers' names."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    converted = [fqn for fqn, m in model.named_modules() if fp8_linear_filter(m, fqn)]
    if not converted:
        raise ValueError(
            "train.precision = 'fp8': no Linear layer has both dimensions a multiple of 16"
        )
    config = Float8LinearConfig.from_recipe_name(recipe)
    convert_to_float8_training(model, config=config, module_filter_fn=fp8_linear_filter)
    return converted
