"""Kinds that act on the run itself: batch-size ramp, eval / checkpoint cadence, early stop."""

from __future__ import annotations

import math
import statistics
from typing import TYPE_CHECKING

from ats_train.orchestrator.base import (
    AFTER_EVALUATIONS,
    ANY_TIME,
    Change,
    Evidence,
    Intervention,
    OrchestratorState,
    Trigger,
    above,
)
from ats_train.orchestrator.changes import SetBatchSize, SetCadence
from ats_train.orchestrator.convergence import ConvergenceDetector
from ats_train.orchestrator.signals import noise

if TYPE_CHECKING:
    from ats_train.orchestrator.handle import RunHandle


class BatchRamp(Intervention):
    """Batch-size ramp (off while `max_batch_size` is None; GPT-3's ramp, Brown et al. 2020, made
    adaptive): when the loss stops improving by more than `min_improvement` over the window, the
    global batch x `scale` up to `max_batch_size`. The micro-batch stays, so accumulation grows; the
    loader is rebuilt at the same position in the same data order."""

    name = "batch_ramp"
    action = "global batch x factor"
    phase = AFTER_EVALUATIONS
    evidence = "a window of train records after warmup"

    def check(self, evidence: Evidence, run: RunHandle, orch: OrchestratorState) -> Trigger | None:
        s, target = evidence.signals, self.settings.max_batch_size
        if target is None or run.setting("train.batch_size") * self.settings.scale > target:
            return None
        if s.loss_rel_change is None or s.loss_rel_change <= -self.settings.min_improvement:
            return None
        return Trigger(f"loss moved {s.loss_rel_change:+.2%}: gradient noise dominates", 1.0)

    def apply(self, evidence: Evidence, run: RunHandle, orch: OrchestratorState) -> Change:
        before = run.batch
        after = before.with_global_batch(int(before.global_batch * self.settings.scale))
        run.apply(SetBatchSize(after.global_batch, after.micro_batch))
        orch.settings["train.batch_size"] = after.global_batch
        orch.settings["train.micro_batch_size"] = after.micro_batch
        return {
            "train.batch_size": [before.global_batch, after.global_batch],
            "accumulation": [before.accumulation, after.accumulation],
        }


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def instability_events(records: list[dict], sigmas: float) -> int:
    """Steps in `records` with a skipped update, a non-finite loss or grad norm, a loss more than
    `sigmas` x the window's step-to-step noise above the median of the 5 steps before it, or a
    grad norm > 20x the median. Relative to the run's own noise: a noisy but healthy run (small
    batches, mixed documents) has no events."""
    grads = [r["grad_norm"] for r in records if _finite(r["grad_norm"])]
    grad_med = statistics.median(grads) if grads else math.inf
    spread = noise([r["loss"] for r in records if _finite(r["loss"])])
    count = 0
    for i, r in enumerate(records):
        loss, grad = r["loss"], r["grad_norm"]
        bad = (loss is not None and not _finite(loss)) or (grad is not None and not _finite(grad))
        before = [x["loss"] for x in records[max(0, i - 5) : i] if _finite(x["loss"])]
        spike = (
            _finite(loss)
            and bool(spread)
            and len(before) >= 3
            and loss - statistics.median(before) > sigmas * spread
        )
        spike = spike or (_finite(grad) and grad > 20 * grad_med)
        count += bool(r.get("skipped") or bad or spike)
    return count


class EvalCkptFrequency(Intervention):
    """Instability: `events` or more instability events (see instability_events) in the window.
    Action: train.eval_every and checkpoint.every x `scale` (>= `min_interval`), so a bad turn is
    seen sooner and a rollback loses less."""

    name = "eval_ckpt_frequency"
    action = "eval and checkpoint intervals x factor"
    phase = ANY_TIME
    evidence = "orchestrator.min_records train records"

    def check(self, evidence: Evidence, run: RunHandle, orch: OrchestratorState) -> Trigger | None:
        events = instability_events(evidence.records, self.settings.sigmas)
        if events < self.settings.events:
            return None
        floor = max(1, self.settings.min_interval)
        eval_every, ckpt_every = run.setting("train.eval_every"), run.setting("checkpoint.every")
        if eval_every in (0, floor) and ckpt_every in (0, floor):
            return None
        return Trigger(
            f"{events} instability events in the window", above(events, self.settings.events)
        )

    def apply(self, evidence: Evidence, run: RunHandle, orch: OrchestratorState) -> Change:
        floor, change, after = max(1, self.settings.min_interval), {}, {}
        for key in ("train.eval_every", "checkpoint.every"):
            before = after[key] = run.setting(key)
            if before:
                after[key] = max(floor, int(before * self.settings.scale))
                orch.settings[key] = after[key]
                change[key] = [before, after[key]]
        run.apply(SetCadence(after["train.eval_every"], after["checkpoint.every"]))
        return change


class EarlyStop(Intervention):
    """Convergence (convergence.ConvergenceDetector): the window-mean train loss of the last
    `patience` evaluations improved on the best before them by less than `min_delta` (relative).
    Action: the run stops after this step, with its final evaluation and checkpoint."""

    name = "early_stop"
    action = "stop the run after this step"
    phase = AFTER_EVALUATIONS
    evidence = "patience + 1 evaluations after warmup"

    def check(self, evidence: Evidence, run: RunHandle, orch: OrchestratorState) -> Trigger | None:
        detector = ConvergenceDetector(self.settings.min_delta, self.settings.patience)
        if not detector.converged(orch.eval_means):
            return None
        recent = orch.eval_means[-detector.patience :]
        return Trigger(
            f"loss {min(recent):.4f} over {detector.patience} evaluations, no better than "
            f"{min(orch.eval_means[: -detector.patience]):.4f} by {self.settings.min_delta:.1%}",
            1.0,
        )

    def apply(self, evidence: Evidence, run: RunHandle, orch: OrchestratorState) -> Change:
        orch.stop_requested = True
        return {"stop": [False, True], "train.steps": [run.setting("train.steps"), run.step]}
