"""The allowed values of every string-valued config key, as Literal types (the config's enums),
and the checks every section runs on itself: `require` and `check_choices`."""

from __future__ import annotations

import typing
from typing import Literal

from ats_train.errors import ConfigError

# fp8: bf16 autocast with the Linear layers' GEMMs in float8 through torchao (fp8.py)
PrecisionName = Literal["fp32", "bf16", "fp16", "fp8"]
Fp8Recipe = Literal["tensorwise", "rowwise"]  # torchao Float8LinearConfig.from_recipe_name
# the residual stream's dtype under autocast (train.residual_stream)
ResidualStream = Literal["fp32", "autocast"]
ScheduleName = Literal["cosine", "wsd"]
DeviceName = Literal["auto", "cpu", "cuda"]
SdpaBackendName = Literal[
    "auto", "default", "cudnn", "flash", "efficient", "math"
]  # attention_backend.py
LoaderMode = Literal["random", "packed"]
Objective = Literal["pretrain", "sft", "dpo", "grpo"]  # train.objective
# every backend but single runs under torchrun (deepspeed also under the `deepspeed` launcher)
BackendName = Literal["single", "ddp", "fsdp2", "deepspeed", "colossalai"]
OffloadDevice = Literal["none", "cpu", "nvme"]  # deepspeed: where ZeRO keeps optimizer/parameters
ZeroStage = Literal[1, 2, 3]  # deepspeed: 1 optimizer state, 2 + gradients, 3 + parameters sharded
# colossalai runs only in the isolated env envs/colossalai (torch 2.5.1), on CUDA
ColossalAIPlugin = Literal["low_level_zero"]
KernelsName = Literal["auto", "reference", "triton"]  # ats_kernels.select()
TrainableName = Literal["all", "lora", "routers"]  # train.trainable (adapters/trainable.py)
# full: rank 0 writes the gathered optimizer state (resumes anywhere); sharded: every rank writes
# its own shard (safetensors + JSON, or DeepSpeed's own ZeRO files): checkpoint_sharded.py
CheckpointFormat = Literal["full", "sharded"]


def require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def choices_of(hint: object) -> tuple[object, ...] | None:
    """The allowed values of a Literal hint, else None."""
    return typing.get_args(hint) if typing.get_origin(hint) is Literal else None


def is_one_of(value: object, allowed: tuple[object, ...]) -> bool:
    """`value` is one of `allowed`, type included (true is not the stage 1, nor 3.0 the stage 3)."""
    return any(value == a and type(value) is type(a) for a in allowed)


def not_one_of(key: str, shown: str, allowed: tuple[object, ...]) -> ConfigError:
    """The error for a value (`shown` as the message prints it) outside `allowed`."""
    return ConfigError(f"{key} = {shown} is not one of {', '.join(map(str, allowed))}")


def check_choices(section: object, prefix: str) -> None:
    """Every Literal-typed field of `section` holds one of its values (sections built in Python
    skip the loader's coercion, so they check themselves)."""
    for name, hint in typing.get_type_hints(type(section)).items():
        allowed = choices_of(hint)
        value = getattr(section, name)
        if allowed is not None and not is_one_of(value, allowed):
            key = f"{prefix}.{name}" if prefix else name
            raise not_one_of(key, repr(value), allowed)
