"""Kinds that act on the run itself: batch-size ramp, eval / checkpoint cadence, early stop."""

from __future__ import annotations

import math
import statistics

from ats_data.loader import TokenLoader

from ats_train.orchestrator.base import Change, Evidence, Intervention, Trigger, above
from ats_train.orchestrator.convergence import ConvergenceDetector


class BatchRamp(Intervention):
    """Batch-size ramp (off while `target` is None; GPT-3's ramp, Brown et al. 2020, made
    adaptive): when the loss stops improving by more than `threshold` over the window, the global
    batch x factor up to `target`. The micro-batch stays, so accumulation grows; the loader is
    rebuilt at the same position in the same data order."""

    name = "batch_ramp"
    action = "global batch x factor"

    def check(self, evidence: Evidence, trainer, orch) -> Trigger | None:
        s, target = evidence.signals, self.settings.target
        if target is None or trainer.config.train.batch_size * self.settings.factor > target:
            return None
        if s.loss_rel_change is None or s.loss_rel_change <= -self.settings.threshold:
            return None
        return Trigger(f"loss moved {s.loss_rel_change:+.2%}: gradient noise dominates", 1.0)

    def apply(self, evidence: Evidence, trainer, orch) -> Change:
        train, old = trainer.config.train, trainer.train_loader
        before, micro = train.batch_size, trainer.micro_batch_size
        train.batch_size = int(before * self.settings.factor)
        train.micro_batch_size = micro
        per_rank = train.batch_size // trainer.backend.world_size
        loader = TokenLoader(
            old.dataset,
            old.split,
            per_rank,
            old.seq_len,
            seed=old.seed,
            rank=old.rank,
            world_size=old.world_size,
            mode=old.mode,
        )
        consumed = old.step * old.global_batch  # windows of this epoch already used
        state = loader.state_dict()
        step = math.ceil(consumed / loader.global_batch)
        epoch = old.epoch + (1 if step >= loader.steps_per_epoch else 0)
        state.update(epoch=epoch, step=0 if step >= loader.steps_per_epoch else step)
        loader.load_state_dict(state)
        trainer.train_loader = loader
        orch.settings["train.batch_size"] = train.batch_size
        orch.settings["train.micro_batch_size"] = micro
        return {
            "train.batch_size": [before, train.batch_size],
            "accumulation": [before // micro, train.batch_size // micro],
        }


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def instability_events(records: list[dict]) -> int:
    """Steps in `records` with a skipped update, a non-finite loss or grad norm, a loss > 1.15x
    the median of the 5 steps before it (skip_batch's test) or a grad norm > 20x the median."""
    grads = [r["grad_norm"] for r in records if _finite(r["grad_norm"])]
    grad_med = statistics.median(grads) if grads else math.inf
    count = 0
    for i, r in enumerate(records):
        loss, grad = r["loss"], r["grad_norm"]
        bad = (loss is not None and not _finite(loss)) or (grad is not None and not _finite(grad))
        before = [x["loss"] for x in records[max(0, i - 5) : i] if _finite(x["loss"])]
        spike = _finite(loss) and len(before) >= 3 and loss > 1.15 * statistics.median(before)
        spike = spike or (_finite(grad) and grad > 20 * grad_med)
        count += bool(r.get("skipped") or bad or spike)
    return count


class EvalCkptFrequency(Intervention):
    """Instability: `threshold` or more instability events (see instability_events) in the window.
    Action: train.eval_every and checkpoint.every x factor (>= limit), so a bad turn is seen
    sooner and a rollback loses less."""

    name = "eval_ckpt_frequency"
    action = "eval and checkpoint intervals x factor"

    def check(self, evidence: Evidence, trainer, orch) -> Trigger | None:
        events = instability_events(evidence.records)
        if events < self.settings.threshold:
            return None
        config, floor = trainer.config, max(1, int(self.settings.limit))
        if config.train.eval_every in (0, floor) and config.checkpoint.every in (0, floor):
            return None
        return Trigger(
            f"{events} instability events in the window", above(events, self.settings.threshold)
        )

    def apply(self, evidence: Evidence, trainer, orch) -> Change:
        floor, change = max(1, int(self.settings.limit)), {}
        for section, attr, key in (
            (trainer.config.train, "eval_every", "train.eval_every"),
            (trainer.config.checkpoint, "every", "checkpoint.every"),
        ):
            before = getattr(section, attr)
            if before:
                setattr(section, attr, max(floor, int(before * self.settings.factor)))
                orch.settings[key] = getattr(section, attr)
                change[key] = [before, getattr(section, attr)]
        return change


class EarlyStop(Intervention):
    """Convergence (convergence.ConvergenceDetector): the window-mean train loss of the last
    `limit` evaluations improved on the best before them by less than `threshold` (relative).
    Action: the run stops after this step, with its final evaluation and checkpoint."""

    name = "early_stop"
    action = "stop the run after this step"

    def check(self, evidence: Evidence, trainer, orch) -> Trigger | None:
        detector = ConvergenceDetector(self.settings.threshold, int(self.settings.limit))
        if not detector.converged(orch.eval_means):
            return None
        recent = orch.eval_means[-detector.patience :]
        return Trigger(
            f"loss {min(recent):.4f} over {detector.patience} evaluations, no better than "
            f"{min(orch.eval_means[: -detector.patience]):.4f} by {self.settings.threshold:.1%}",
            1.0,
        )

    def apply(self, evidence: Evidence, trainer, orch) -> Change:
        orch.stop_requested = True
        return {"stop": [False, True], "train.steps": [trainer.config.train.steps, trainer.step]}
