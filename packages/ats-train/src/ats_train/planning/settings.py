"""TrainConfig [plan]: how train.steps is chosen (sizing a run by a compute law, chinchilla.py).
No torch here: the config package imports this module before any input is validated."""

from __future__ import annotations

from dataclasses import dataclass

from ats_train.errors import ConfigError


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


STEPS_FROM = ("config", "tokens_per_param", "flops")
LAWS = ("approach1", "parametric")


@dataclass(frozen=True)
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
