"""TrainConfig's [orchestrator] section: mode, cadence, one table per intervention kind.

No torch here: config.py imports this module before any input is validated.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from ats_train.errors import ConfigError

MODES = ("act", "advise", "off")


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
