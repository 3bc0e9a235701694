"""DeepSpeed's ZeRO checkpoint files read without running code: torch.load(weights_only=True).

DeepSpeed writes its sharded checkpoints (mp_rank_*_model_states.pt, zero_pp_rank_*_optim_states.pt)
with torch.save, a pickle, and its TorchCheckpointEngine loads them with weights_only=False: a
payload in a checkpoint from elsewhere ran code on resume (issue 22). While engine.load_checkpoint
runs, its checkpoint engine is swapped for one whose load is torch's restricted unpickler
(tensors, plain containers and numbers) plus the few DeepSpeed data classes these files hold,
found with torch.serialization.get_unsafe_globals_in_checkpoint on ZeRO-1/2/3 checkpoints of
DeepSpeed 0.19: rebuilding them sets attributes, calls nothing else. Any other global is refused.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pickle import UnpicklingError
from typing import Any

import torch

from ats_train.checkpoint import CheckpointError


def allowed_globals() -> list[Any]:
    """The DeepSpeed classes its ZeRO checkpoint files pickle (besides torch's own)."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [ZeroStageEnum, LossScaler, DynamicLossScaler, fragment_address]


class WeightsOnlyCheckpointEngine:
    """What DeepSpeedEngine.load_checkpoint calls on its checkpoint engine (load, nothing else in
    DeepSpeed 0.18-0.19), restricted to data."""

    def load(self, path: str, map_location: Any = None) -> Any:
        with torch.serialization.safe_globals(allowed_globals()):
            try:
                return torch.load(path, map_location=map_location, weights_only=True)
            except UnpicklingError as e:
                # torch's message is lines of advice around the one naming the global
                lines = [line.strip() for line in str(e).splitlines() if "GLOBAL" in line]
                reason = (lines or str(e).splitlines())[0]
                reason = reason.removeprefix("WeightsUnpickler error: ").split(". ")[0]
                raise CheckpointError(
                    f"{path}: refused to load: it holds more than tensors and DeepSpeed's own data "
                    f"classes ({reason})"
                ) from e


@contextmanager
def weights_only_loads(engine: Any) -> Iterator[None]:
    """engine.load_checkpoint inside this block reads its files with WeightsOnlyCheckpointEngine."""
    saved = engine.checkpoint_engine
    engine.checkpoint_engine = WeightsOnlyCheckpointEngine()
    try:
        yield
    finally:
        engine.checkpoint_engine = saved
