"""Parallel backends behind one interface (base.Backend); `parallel.backend` picks one.

single (one process), ddp (DistributedDataParallel), fsdp2 (fully_shard) and deepspeed (ZeRO 1-3,
CPU/NVMe offload; the optional extra ats-train[deepspeed]) exist.
colossalai (Booster + LowLevelZero) runs only in the isolated env envs/colossalai, on CUDA.
ddp, fsdp2, deepspeed and colossalai run under torchrun (deepspeed also under its own launcher).
"""

from __future__ import annotations

import typing

import torch

from ats_train.backends.base import Backend
from ats_train.backends.single import SingleBackend
from ats_train.config import ParallelSection, TrainConfig
from ats_train.config.choices import BackendName
from ats_train.precision import Precision


def build_backend(
    parallel: ParallelSection,
    device: torch.device,
    precision: Precision,
    *,
    config: TrainConfig | None = None,
) -> Backend:
    """`config` (the whole TrainConfig) is needed by deepspeed, whose JSON holds the batch sizes
    and gradient clipping."""
    if parallel.backend == "single":
        return SingleBackend(device, precision)
    if parallel.backend == "ddp":
        from ats_train.backends.ddp import DDPBackend  # torch.distributed only when asked for

        return DDPBackend(device, precision, parallel.expert_parallel)
    if parallel.backend == "fsdp2":
        from ats_train.backends.fsdp2 import FSDP2Backend

        return FSDP2Backend(device, precision, parallel.fsdp2, parallel.expert_parallel)
    if parallel.backend == "deepspeed":
        if config is None or config.parallel is not parallel:
            raise ValueError(
                "build_backend(parallel.backend = 'deepspeed') needs config=TrainConfig"
            )
        from ats_train.backends.deepspeed import DeepSpeedBackend  # imports deepspeed

        return DeepSpeedBackend(config, device, precision)
    if parallel.backend == "colossalai":
        # importing it imports colossalai: only inside the isolated env envs/colossalai
        from ats_train.backends.colossalai import ColossalAIBackend

        return ColossalAIBackend(device, precision, parallel.colossalai.plugin)
    raise ValueError(  # unreachable through ParallelSection, which validates the name first
        f"parallel.backend = {parallel.backend!r} is not one of {', '.join(typing.get_args(BackendName))}"
    )


__all__ = ["Backend", "SingleBackend", "build_backend"]
