"""TrainConfig's [orchestrator] section: mode, cadence, one table per intervention kind.

No torch here: the config package imports this module before any input is validated.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from ats_train.errors import ConfigError

MODES = ("act", "advise", "off")


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


@dataclass(frozen=True)
class KindSettings:
    """What every intervention kind has: its switch, its cooldown and its confidence floor. Each
    kind adds its own named knobs below (what they mean: the kind's class in orchestrator/kinds/)."""

    enabled: bool = True
    cooldown: int = 10  # steps before this kind may fire again
    min_confidence: float = 0.5  # a trigger weaker than this is not acted on

    def __post_init__(self) -> None:
        _check(self.cooldown >= 0, f"cooldown = {self.cooldown} must be >= 0")
        _check(
            0.0 <= self.min_confidence <= 1.0,
            f"min_confidence = {self.min_confidence} must be in [0, 1]",
        )
        scale = getattr(self, "scale", 1.0)
        _check(scale > 0.0, f"scale = {scale} must be > 0")


@dataclass(frozen=True)
class LRCutSettings(KindSettings):
    # the loss's rise over its best, in units of the run's step-to-step loss noise, that means
    # divergence (val loss: its relative rise over its best, in units of the relative noise)
    sigmas: float = 5.0
    scale: float = 0.5  # lr_scale x scale
    min_lr_scale: float = 0.01  # lr_scale is never cut below this


@dataclass(frozen=True)
class LRRewarmSettings(KindSettings):
    # a plateau: the window's half-to-half loss change is within `sigmas` standard errors of 0
    # (the standard error from the run's step-to-step noise), and the noise is low enough that a
    # relative change of `plateau` per window would have shown (else the evidence cannot tell)
    sigmas: float = 2.0
    plateau: float = 0.01
    scale: float = 2.0  # lr_scale x scale
    max_lr_ratio: float = 1.0  # lr_scale's ceiling: the lr never climbs above this x the schedule


@dataclass(frozen=True)
class GradClipSettings(KindSettings):
    # a spike: some step's log grad norm above the median of the 5 before it by more than
    # `sigmas` x the robust step-to-step spread of the log grad norm over the window
    sigmas: float = 10.0
    # and at least this many times the window's median grad norm: on a smooth run the spread is
    # tiny and a 4-7x swing passed 10 sigmas (a healthy 10M H200 run had its clip halved twice)
    min_ratio: float = 10.0
    # and the clip is off or above this many times the median grad norm: a clip at 1.0 with
    # grad norms near 0.2 already bounds a spike (a healthy 10M H200 run had its clip halved 5
    # times, down to 0.05 under a median of 0.11, clipping every step)
    bounded_ratio: float = 4.0
    scale: float = 0.5  # optim.grad_clip x scale
    min_clip: float = 0.05  # optim.grad_clip is never set below this


@dataclass(frozen=True)
class SkipBatchSettings(KindSettings):
    cooldown: int = 0
    # a spike: the loss above the median of the 5 steps before it by more than `sigmas` x the
    # robust step-to-step spread of the loss over the window
    sigmas: float = 8.0
    # and at least this many times that median: on a smooth run the spread is tiny and a healthy
    # 1.07x batch passed 8 sigmas (a 10M H200 run skipped two good updates)
    min_ratio: float = 1.2


@dataclass(frozen=True)
class RollbackSettings(KindSettings):
    cooldown: int = 0
    # lr_scale x scale after the reload when the last rollback was at most `repeat_within` steps
    # before (a NaN that comes back is the run's, not a one-off: the replay needs a lower lr);
    # x first_scale after any other
    scale: float = 0.5
    repeat_within: int = 100
    first_scale: float = 1.0
    # a NaN after this many rollbacks within repeat_within steps stops the run with an error:
    # one the replays do not get past would otherwise roll back, halving the lr, for ever
    max_rollbacks: int = 5

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self.first_scale > 0.0, f"first_scale = {self.first_scale} must be > 0")
        _check(self.repeat_within >= 0, f"repeat_within = {self.repeat_within} must be >= 0")
        _check(self.max_rollbacks >= 1, f"max_rollbacks = {self.max_rollbacks} must be >= 1")


@dataclass(frozen=True)
class OOMSettings(KindSettings):
    cooldown: int = 0


@dataclass(frozen=True)
class PruneExpertsSettings(KindSettings):
    min_utilization: float = 0.1  # an expert below this share x n_experts is pruned
    experts_dropped: int = 1  # experts dropped per MoE layer each time
    # the same expert under the floor by `sigmas` standard errors at this many evaluations in a row
    # (a healthy run's experts dip there for an evaluation or two while routing settles)
    evaluations: int = 4
    sigmas: float = 2.0

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self.evaluations >= 1, f"evaluations = {self.evaluations} must be >= 1")
        _check(self.sigmas >= 0.0, f"sigmas = {self.sigmas} must be >= 0")


@dataclass(frozen=True)
class SplitExpertSettings(KindSettings):
    max_utilization: float = 2.5  # an expert above this share x n_experts is split
    max_experts: int = 16  # never more experts per layer than this
    evaluations: int = 4  # as prune_experts: the same expert over the ceiling this many in a row
    sigmas: float = 2.0

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self.evaluations >= 1, f"evaluations = {self.evaluations} must be >= 1")
        _check(self.sigmas >= 0.0, f"sigmas = {self.sigmas} must be >= 0")


@dataclass(frozen=True)
class CapacityFactorSettings(KindSettings):
    max_dropped: float = 0.1  # share of routed slots dropped above which capacity grows
    scale: float = 1.25  # capacity_factor x scale
    max_capacity_factor: float = 4.0


@dataclass(frozen=True)
class RouterTemperatureSettings(KindSettings):
    min_entropy: float = 0.5  # router entropy / ln(E) below this is a collapse
    scale: float = 1.5  # temperature x scale
    max_temperature: float = 4.0


@dataclass(frozen=True)
class AuxLossWeightsSettings(KindSettings):
    max_imbalance: float = 1.5  # the most-used expert's utilization - 1 above this: raise moe_lb
    max_router_z: float = 50.0  # router z-loss above this: raise moe_z
    scale: float = 2.0  # weight x scale
    max_weight: float = 1.0


@dataclass(frozen=True)
class BiasRateSettings(KindSettings):
    max_imbalance: float = 1.5  # as aux_loss_weights
    start_rate: float = 1e-3  # the rate switched on from 0
    scale: float = 2.0  # a rate already on x scale
    max_rate: float = 0.01


@dataclass(frozen=True)
class ModCapacitySettings(KindSettings):
    target_capacity: float | None = None  # None: the curriculum is off
    stable_change: float = 0.05  # relative loss change below this: one step towards the target
    scale: float = 0.8  # capacity x scale per step (divided when the target is above)


@dataclass(frozen=True)
class ModCollapseSettings(KindSettings):
    min_kept_ratio: float = 0.2  # the predictor keeping less than this x capacity is a collapse
    # its loss within this share of chance (the keep rate's binary entropy) is an untrained
    # predictor, whose keep share is the sign of near-zero logits: early training, not a collapse
    chance_band: float = 0.1
    # a trained predictor (loss below the band) is collapsed when it keeps under the floor in every
    # one of this many records, not rising (<= orchestrator.window, or this test never fires)
    stuck_steps: int = 20
    scale: float = 2.0  # loss.mod_predictor_weight x scale
    max_weight: float = 10.0

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(0.0 < self.chance_band < 1.0, f"chance_band = {self.chance_band} must be in (0, 1)")
        _check(self.stuck_steps >= 3, f"stuck_steps = {self.stuck_steps} must be >= 3")


@dataclass(frozen=True)
class WeightDecaySettings(KindSettings):
    norm_growth: float = 1.5  # parameter norm growing more than this x over the window
    scale: float = 2.0  # each decayed group's weight_decay x scale
    max_decay: float = 1.0


@dataclass(frozen=True)
class BatchRampSettings(KindSettings):
    max_batch_size: int | None = None  # None: the ramp is off
    min_improvement: float = 0.01  # relative loss improvement over the window below this: ramp
    scale: float = 2.0  # global batch x scale


@dataclass(frozen=True)
class EvalCkptFrequencySettings(KindSettings):
    events: int = 1  # instability events in the window that make the intervals shorter
    sigmas: float = 8.0  # a loss this many noise-sigmas above the 5 steps before it is an event
    scale: float = 0.5  # train.eval_every and checkpoint.every x scale
    # never below this many steps: each evaluation and checkpoint costs the run time, and halving
    # without a floor reached one of each every step on a 124M H200 run
    min_interval: int = 50


@dataclass(frozen=True)
class EarlyStopSettings(KindSettings):
    enabled: bool = False  # opt-in: stopping a run is the user's call (it then acts in mode act)
    cooldown: int = 0
    min_delta: float = 0.01  # relative improvement on the best that still counts as progress
    patience: int = 3  # evaluations without such progress before the run stops


# The knobs every kind shared before each had its own names: old key -> new key.
RENAMED = {
    f"orchestrator.{kind}.{old}": f"orchestrator.{kind}.{new}"
    for kind, names in {
        "lr_cut": {"threshold": "sigmas", "factor": "scale", "limit": "min_lr_scale"},
        "lr_rewarm": {"threshold": "plateau", "factor": "scale", "limit": "max_lr_ratio"},
        "grad_clip": {"threshold": "sigmas", "factor": "scale", "limit": "min_clip"},
        "skip_batch": {"threshold": "sigmas"},
        "rollback": {"factor": "scale"},
        "prune_experts": {"threshold": "min_utilization", "limit": "experts_dropped"},
        "split_expert": {"threshold": "max_utilization", "limit": "max_experts"},
        "capacity_factor": {
            "threshold": "max_dropped",
            "factor": "scale",
            "limit": "max_capacity_factor",
        },
        "router_temperature": {
            "threshold": "min_entropy",
            "factor": "scale",
            "limit": "max_temperature",
        },
        "aux_loss_weights": {
            "threshold": "max_imbalance",
            "factor": "scale",
            "limit": "max_weight",
            "target": "max_router_z",
        },
        "bias_rate": {
            "threshold": "max_imbalance",
            "factor": "scale",
            "limit": "max_rate",
            "target": "start_rate",
        },
        "mod_capacity": {
            "threshold": "stable_change",
            "factor": "scale",
            "target": "target_capacity",
        },
        "mod_collapse": {"threshold": "min_kept_ratio", "factor": "scale", "limit": "max_weight"},
        "weight_decay": {"threshold": "norm_growth", "factor": "scale", "limit": "max_decay"},
        "batch_ramp": {
            "threshold": "min_improvement",
            "factor": "scale",
            "target": "max_batch_size",
        },
        "eval_ckpt_frequency": {"threshold": "events", "factor": "scale", "limit": "min_interval"},
        "early_stop": {"threshold": "min_delta", "limit": "patience"},
    }.items()
    for old, new in names.items()
}


@dataclass(frozen=True)
class OrchestratorSection:
    # act (default): apply decisions; advise: log them, apply only the recovery kinds (rollback,
    # skip_batch, oom, grad_clip); off: not consulted at all, the run is the plain trainer's
    mode: str = "act"
    every: int = 10  # steps between evaluations of the every-N kinds (guards run every step)
    window: int = 20  # train records the signals are computed over
    min_records: int = 8  # no every-N kind fires before the window holds this many records
    # trend kinds (lr_cut, lr_rewarm, weight_decay, batch_ramp, mod_capacity, early_stop) wait for
    # this many evaluations after the LR warmup
    min_evaluations: int = 3
    # after any applied change, the every-N kinds wait this many steps and judge only records
    # from after the change (the signals before it describe a run that no longer exists)
    cooldown: int = 20
    # the display shows a kind's advice at most once per this many steps (decisions.jsonl: all)
    advice_every: int = 200
    # Per kind: see the class of the same name in ats_train.orchestrator.kinds.
    lr_cut: LRCutSettings = field(default_factory=LRCutSettings)
    lr_rewarm: LRRewarmSettings = field(default_factory=LRRewarmSettings)
    grad_clip: GradClipSettings = field(default_factory=GradClipSettings)
    skip_batch: SkipBatchSettings = field(default_factory=SkipBatchSettings)
    rollback: RollbackSettings = field(default_factory=RollbackSettings)
    oom: OOMSettings = field(default_factory=OOMSettings)
    prune_experts: PruneExpertsSettings = field(default_factory=PruneExpertsSettings)
    split_expert: SplitExpertSettings = field(default_factory=SplitExpertSettings)
    capacity_factor: CapacityFactorSettings = field(default_factory=CapacityFactorSettings)
    router_temperature: RouterTemperatureSettings = field(default_factory=RouterTemperatureSettings)
    aux_loss_weights: AuxLossWeightsSettings = field(default_factory=AuxLossWeightsSettings)
    bias_rate: BiasRateSettings = field(default_factory=BiasRateSettings)
    mod_capacity: ModCapacitySettings = field(default_factory=ModCapacitySettings)
    mod_collapse: ModCollapseSettings = field(default_factory=ModCollapseSettings)
    weight_decay: WeightDecaySettings = field(default_factory=WeightDecaySettings)
    batch_ramp: BatchRampSettings = field(default_factory=BatchRampSettings)
    eval_ckpt_frequency: EvalCkptFrequencySettings = field(
        default_factory=EvalCkptFrequencySettings
    )
    early_stop: EarlyStopSettings = field(default_factory=EarlyStopSettings)

    def __post_init__(self) -> None:
        _check(self.mode in MODES, f"orchestrator.mode = {self.mode!r} is not one of {MODES}")
        _check(self.every >= 1, f"orchestrator.every = {self.every} must be >= 1")
        _check(self.window >= 4, f"orchestrator.window = {self.window} must be >= 4")
        _check(
            2 <= self.min_records <= self.window,
            f"orchestrator.min_records = {self.min_records} must be in [2, window={self.window}]",
        )
        for name in ("min_evaluations", "cooldown", "advice_every"):
            value = getattr(self, name)
            _check(value >= 0, f"orchestrator.{name} = {value} must be >= 0")

    def kinds(self) -> dict[str, KindSettings]:
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if isinstance(getattr(self, f.name), KindSettings)
        }
