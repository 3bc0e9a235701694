"""Parallel backends behind one interface (base.Backend); `parallel.backend` picks one.

single (one process), ddp (DistributedDataParallel) and fsdp2 (fully_shard) exist; deepspeed and
colossalai are planned (issue 6) and are refused by config validation with a "not implemented
yet" error. ddp and fsdp2 run under torchrun.
"""

from __future__ import annotations

import torch

from ats_train.backends.base import Backend
from ats_train.backends.single import SingleBackend
from ats_train.config import ParallelSection
from ats_train.precision import Precision


def build_backend(parallel: ParallelSection, device: torch.device, precision: Precision) -> Backend:
    if parallel.backend == "single":
        return SingleBackend(device, precision)
    if parallel.backend == "ddp":
        from ats_train.backends.ddp import DDPBackend  # torch.distributed only when asked for

        return DDPBackend(device, precision)
    if parallel.backend == "fsdp2":
        from ats_train.backends.fsdp2 import FSDP2Backend

        return FSDP2Backend(device, precision, parallel.cpu_offload)
    raise NotImplementedError(f"parallel.backend = {parallel.backend!r} is not implemented yet")


__all__ = ["Backend", "SingleBackend", "build_backend"]
