"""Parallel backends behind one interface (base.Backend); `parallel.backend` picks one.

Only `single` exists today; ddp, fsdp2, deepspeed and colossalai are planned (issue 6) and are
refused by config validation with a "not implemented yet" error.
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
    raise NotImplementedError(f"parallel.backend = {parallel.backend!r} is not implemented yet")


__all__ = ["Backend", "SingleBackend", "build_backend"]
