"""TrainConfig [faults]: conditions injected into a real run (faults/inject.py), all off by
default. No torch here: the config package imports this module before any input is validated."""

from __future__ import annotations

from dataclasses import dataclass, fields

from ats_train.errors import ConfigError


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


@dataclass(frozen=True)
class FaultsSection:
    """Conditions injected into a real run, for tests and drills. Steps are 1-based optimizer steps
    (the "step" of metrics.jsonl); None = off. Each fault fires once per process (nan_grad:
    nan_grad_times)."""

    nan_grad_at_step: int | None = None  # one gradient element set to NaN after backward
    # passes through nan_grad_at_step that get the NaN: 1 = a one-off; more = a NaN that comes
    # back each time a rollback replays the step, up to this many times
    nan_grad_times: int = 1
    loss_spike_at_step: int | None = None  # that batch's targets replaced by random tokens
    grad_spike_at_step: int | None = None  # gradients multiplied by grad_spike_factor
    grad_spike_factor: float = 1000.0
    oom_at_step: int | None = None  # from this step, a micro-batch > oom_max_micro_batch OOMs
    oom_max_micro_batch: int = 1
    routing_collapse_at_step: int | None = (
        None  # every MoE router sends all tokens to top_k experts
    )
    # the last `dead_experts` experts of every MoE layer are never selected (a large negative bias)
    dead_experts_at_step: int | None = None
    dead_experts: int = 2
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
        _check(
            self.nan_grad_times >= 1, f"faults.nan_grad_times = {self.nan_grad_times} must be >= 1"
        )
        _check(self.oom_max_micro_batch >= 1, "faults.oom_max_micro_batch must be >= 1")
        _check(self.dead_experts >= 1, f"faults.dead_experts = {self.dead_experts} must be >= 1")
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name.endswith("_factor"):
                _check(value > 0, f"faults.{f.name} = {value} must be > 0")
