"""What every intervention kind is: a trigger on signals, an action on the run, a cooldown and a
confidence. Kinds are small classes in kinds/; the Orchestrator decides when to ask them. A kind
reads the run through its RunHandle and changes it only by handing it change records (changes.py).

A kind sees only the records gathered since its own last action (so one spike does not fire the
same kind twice) and reports each change as {"what": [before, after]}, which is logged verbatim.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from ats_train.orchestrator.settings import KindSettings
from ats_train.orchestrator.signals import Signals, compute_signals

if TYPE_CHECKING:
    from ats_train.orchestrator.handle import RunHandle


@dataclass
class Evidence:
    """What a kind judges: its records, all val records, and the signals of both, computed on first
    use (the guards run every step and mostly read one record: they never pay for the window)."""

    records: list[dict[str, Any]]
    val: list[dict[str, Any]]
    flops_per_token: float

    @cached_property
    def signals(self) -> Signals:
        return compute_signals(self.records, self.val, self.flops_per_token)


@dataclass
class Trigger:
    reason: str  # one line, with the numbers that fired it
    confidence: float  # in [0, 1]; below the kind's min_confidence nothing is done


def above(value: float, threshold: float) -> float:
    """Confidence of `value > threshold`: 0.5 at the threshold, 1 at 1.5x it."""
    if threshold <= 0:
        return 1.0
    return max(0.0, min(1.0, value / threshold - 0.5))


def below(value: float, threshold: float) -> float:
    """Confidence of `value < threshold`: 0.5 at the threshold, 1 at two thirds of it or less."""
    if value <= 0:
        return 1.0
    return max(0.0, min(1.0, threshold / value - 0.5))


Change = dict[str, list[Any]]  # "what" -> [before, after]


class OrchestratorState(Protocol):
    """What a kind reads and sets of the Orchestrator that asks it (orchestrator.py)."""

    lr_scale: float  # multiplies the schedule's lr
    stop_requested: bool
    settings: dict[str, Any]  # dotted config key -> value it was changed to
    eval_means: list[float]  # window-mean train loss at each evaluation
    history: list[dict[str, Any]]  # every decision so far, oldest first
    flops_per_token: float

    def reset_window(self) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any], rewrite_log: bool = True) -> None: ...


ANY_TIME = "any time"  # judged from the first records on (guards, recovery)
AFTER_WARMUP = "after warmup"  # not while the LR warms up (routing and weights still settle)
AFTER_EVALUATIONS = "after warmup and min_evaluations"  # trend kinds: plateaus, rises, growth


class Intervention:
    """Base class. Subclasses set `name` (the [orchestrator.<name>] table) and implement check/apply.

    guard = True: evaluated every step by the hook that owns it (skip_batch, rollback, oom), not by
    the every-N evaluation. recovery = True: acts in mode advise too (a run that is not rescued
    dies or is ruined). phase: from when in the run the kind may judge (the Orchestrator enforces
    it); evidence: what the kind needs to judge, in words (its docstring says the test)."""

    name: ClassVar[str]
    action: ClassVar[str]  # what it does, in a few words (the decision log's "action")
    guard: ClassVar[bool] = False
    recovery: ClassVar[bool] = False
    phase: ClassVar[str] = AFTER_WARMUP
    evidence: ClassVar[str] = "orchestrator.min_records train records after warmup (window means)"

    def __init__(self, settings: KindSettings) -> None:
        self.settings = settings

    def check(self, evidence: Evidence, run: RunHandle, orch: OrchestratorState) -> Trigger | None:
        raise NotImplementedError

    def apply(self, evidence: Evidence, run: RunHandle, orch: OrchestratorState) -> Change:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """What the kind remembers across evaluations (saved with the orchestrator's state)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            raise ValueError(f"{self.name}: keeps no state across evaluations, got {state}")
