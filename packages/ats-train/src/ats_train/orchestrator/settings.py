"""TrainConfig sections owned by the orchestrator: [orchestrator] (mode, cadence, one table per kind),
[faults] (injected conditions, all off by default) and [plan] (sizing a run by a compute law).

No torch here: config.py imports this module before any input is validated.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from ats_train.errors import ConfigError

MODES = ("act", "advise", "off")
STEPS_FROM = ("config", "tokens_per_param", "flops")
LAWS = ("approach1", "parametric")


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


@dataclass
class KindSettings:
    """One intervention kind's switch and knobs. What threshold / factor / limit / target mean is
    documented on each kind's class (ats_train.orchestrator.kinds); None = that kind has no use."""

    enabled: bool = True
    cooldown: int = 10  # steps before this kind may fire again
    min_confidence: float = 0.5  # a trigger weaker than this is not acted on
    threshold: float = 0.0
    factor: float = 1.0
    limit: float | None = None
    target: float | None = None

    def __post_init__(self) -> None:
        _check(self.cooldown >= 0, f"orchestrator.*.cooldown = {self.cooldown} must be >= 0")
        _check(
            0.0 <= self.min_confidence <= 1.0,
            f"orchestrator.*.min_confidence = {self.min_confidence} must be in [0, 1]",
        )
        _check(self.factor > 0.0, f"orchestrator.*.factor = {self.factor} must be > 0")


def _kind(**values: float | None) -> KindSettings:
    return field(default_factory=lambda: KindSettings(**values))


@dataclass
class OrchestratorSection:
    # act: apply decisions; advise (default): log them only; off: not consulted at all
    mode: str = "advise"
    every: int = 10  # steps between evaluations of the every-N kinds (guards run every step)
    window: int = 20  # train records the signals are computed over
    min_records: int = 8  # no every-N kind fires before the window holds this many records
    # Per kind: see the class of the same name in ats_train.orchestrator.kinds.
    lr_cut: KindSettings = _kind(threshold=0.15, factor=0.5, limit=0.01)
    lr_rewarm: KindSettings = _kind(threshold=0.01, factor=2.0, limit=1.0, cooldown=10)
    grad_clip: KindSettings = _kind(threshold=20.0, factor=0.5, limit=0.05)
    skip_batch: KindSettings = _kind(threshold=0.15, cooldown=0)
    rollback: KindSettings = _kind(factor=0.5, cooldown=0)
    oom: KindSettings = _kind(cooldown=0)
    prune_experts: KindSettings = _kind(threshold=0.1, limit=1.0)
    split_expert: KindSettings = _kind(threshold=2.5, limit=16.0)
    capacity_factor: KindSettings = _kind(threshold=0.1, factor=1.25, limit=4.0)
    router_temperature: KindSettings = _kind(threshold=0.5, factor=1.5, limit=4.0)
    aux_loss_weights: KindSettings = _kind(threshold=1.5, factor=2.0, limit=1.0)
    bias_rate: KindSettings = _kind(threshold=1.5, factor=2.0, limit=0.01, target=1e-3)
    mod_capacity: KindSettings = _kind(threshold=0.05, factor=0.8)
    mod_collapse: KindSettings = _kind(threshold=0.2, factor=2.0, limit=10.0)
    weight_decay: KindSettings = _kind(threshold=1.5, factor=2.0, limit=1.0)
    batch_ramp: KindSettings = _kind(threshold=0.01, factor=2.0)
    eval_ckpt_frequency: KindSettings = _kind(threshold=1.0, factor=0.5, limit=1.0)
    early_stop: KindSettings = _kind(threshold=0.01, limit=3.0, cooldown=0)

    def __post_init__(self) -> None:
        _check(self.mode in MODES, f"orchestrator.mode = {self.mode!r} is not one of {MODES}")
        _check(self.every >= 1, f"orchestrator.every = {self.every} must be >= 1")
        _check(self.window >= 4, f"orchestrator.window = {self.window} must be >= 4")
        _check(
            2 <= self.min_records <= self.window,
            f"orchestrator.min_records = {self.min_records} must be in [2, window={self.window}]",
        )

    def kinds(self) -> dict[str, KindSettings]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.type == "KindSettings"}


@dataclass
class FaultsSection:
    """Conditions injected into a real run, for tests and drills. Steps are 1-based optimizer steps
    (the "step" of metrics.jsonl); None = off. Each fault fires once per process."""

    nan_grad_at_step: int | None = None  # one gradient element set to NaN after backward
    loss_spike_at_step: int | None = None  # that batch's targets replaced by random tokens
    grad_spike_at_step: int | None = None  # gradients multiplied by grad_spike_factor
    grad_spike_factor: float = 1000.0
    oom_at_step: int | None = None  # from this step, a micro-batch > oom_max_micro_batch OOMs
    oom_max_micro_batch: int = 1
    routing_collapse_at_step: int | None = (
        None  # every MoE router sends all tokens to top_k experts
    )
    router_sharpen_at_step: int | None = None  # router weights x router_sharpen_factor
    router_sharpen_factor: float = 1000.0
    mod_collapse_at_step: int | None = None  # MoD causal predictors pushed to "skip every token"
    weight_growth_at_step: int | None = None  # every weight matrix x weight_growth_factor
    weight_growth_factor: float = 3.0
    plateau_at_step: int | None = None  # from this step the lr is x plateau_lr_factor (stalled)
    plateau_lr_factor: float = 1e-4
    diverge_at_step: int | None = None  # from this step the lr is x diverge_lr_factor
    diverge_lr_factor: float = 30.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name.endswith("_at_step") and value is not None:
                _check(value >= 1, f"faults.{f.name} = {value} must be >= 1")
        _check(self.oom_max_micro_batch >= 1, "faults.oom_max_micro_batch must be >= 1")
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name.endswith("_factor"):
                _check(value > 0, f"faults.{f.name} = {value} must be > 0")


@dataclass
class PlanSection:
    """How train.steps is chosen. config: as given. tokens_per_param: D = tokens_per_param x N
    (N = active parameters; Hoffmann et al. 2022: about 20). flops: D = plan.flops / the model's
    training FLOPs per token. Either way steps = ceil(D / (batch_size x seq_len))."""

    steps_from: str = "config"
    tokens_per_param: float = 20.0
    flops: float | None = None
    law: str = "approach1"  # compute-optimal law that `ats-train plan` reports (chinchilla.py)

    def __post_init__(self) -> None:
        _check(
            self.steps_from in STEPS_FROM,
            f"plan.steps_from = {self.steps_from!r} is not one of {STEPS_FROM}",
        )
        _check(self.tokens_per_param > 0, f"plan.tokens_per_param = {self.tokens_per_param} <= 0")
        _check(self.law in LAWS, f"plan.law = {self.law!r} is not one of {LAWS}")
        if self.flops is not None:
            _check(self.flops > 0, f"plan.flops = {self.flops} must be > 0")
        _check(
            self.steps_from != "flops" or self.flops is not None,
            "plan.steps_from = 'flops' needs plan.flops",
        )
