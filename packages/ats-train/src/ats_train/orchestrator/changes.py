"""The changes an intervention may ask of a run, one frozen record each. A kind returns them from
apply(); the run (RunHandle.apply, ats_train/run_handle.py) carries each out at once, inside the
hook the loop called, so the next kind judges the changed run. The orchestrator never writes the
model, the optimizer or the config itself. Its own state (lr_scale, stop) is not a run change.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SetGradClip:
    value: float  # optim.grad_clip from now on


@dataclass(frozen=True)
class SetLossWeight:
    name: str  # moe_lb_weight, moe_z_weight or mod_predictor_weight (the [loss] key)
    value: float


@dataclass(frozen=True)
class SetWeightDecay:
    group: int  # index into the optimizer's param_groups
    value: float


@dataclass(frozen=True)
class SetMoE:
    attr: str  # capacity_factor, temperature or bias_update_rate, on every MoE layer
    value: float


@dataclass(frozen=True)
class SetModCapacity:
    value: float  # every MoD layer's capacity


@dataclass(frozen=True)
class PruneExperts:
    keep: tuple[tuple[int, ...], ...]  # per MoE layer, the experts kept (equal counts)


@dataclass(frozen=True)
class SplitExperts:
    experts: tuple[int, ...]  # per MoE layer, the expert copied
    noise_std: float  # the copy's perturbation


@dataclass(frozen=True)
class SplitMicroBatch:
    size: int  # the new micro-batch (a divisor of the per-rank batch); the global batch stays


@dataclass(frozen=True)
class SetBatchSize:
    batch_size: int  # the new global batch; the loader continues at the same data position
    micro_batch_size: int


@dataclass(frozen=True)
class SetCadence:
    eval_every: int  # train.eval_every from now on (0 = off, as configured)
    checkpoint_every: int  # checkpoint.every


@dataclass(frozen=True)
class SkipUpdate:
    """This step's gradients are dropped and the optimizer does not step."""


@dataclass(frozen=True)
class Rollback:
    checkpoint: Path  # reload model, optimizer, loader, RNG and knobs from here


RunChange = (
    SetGradClip
    | SetLossWeight
    | SetWeightDecay
    | SetMoE
    | SetModCapacity
    | PruneExperts
    | SplitExperts
    | SplitMicroBatch
    | SetBatchSize
    | SetCadence
    | SkipUpdate
    | Rollback
)
