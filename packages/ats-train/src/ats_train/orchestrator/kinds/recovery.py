"""Guards that run every step: skip a loss-spiking batch, roll back on NaN/inf, recover from OOM."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ats_train.checkpoint import checkpoint_step
from ats_train.errors import DivergedError
from ats_train.orchestrator.base import (
    ANY_TIME,
    Change,
    Evidence,
    Intervention,
    OrchestratorState,
    Trigger,
    above,
)
from ats_train.orchestrator.changes import Rollback as RollbackTo
from ats_train.orchestrator.changes import SkipUpdate, SplitMicroBatch
from ats_train.orchestrator.signals import loss_spike_ratio, loss_spike_sigmas

if TYPE_CHECKING:
    from ats_train.orchestrator.handle import RunHandle


class SkipBatch(Intervention):
    """Loss spike: this step's loss is above the median of the 5 steps before it by more than
    `sigmas` x the window's step-to-step loss noise and by at least `min_ratio` x that median. Action: the update is not taken (the
    gradients are dropped, the optimizer does not step); the batch is consumed. Judged before the
    update, so not with train.overlap_host (the update is queued before the loss is read)."""

    name = "skip_batch"
    action = "skip this update"
    guard = True
    recovery = True
    phase = ANY_TIME
    evidence = "this step's loss and orchestrator.min_records losses before it"

    def check(self, evidence: Evidence, run: RunHandle, orch: OrchestratorState) -> Trigger | None:
        z, t = loss_spike_sigmas(evidence.records), self.settings.sigmas
        ratio = loss_spike_ratio(evidence.records)
        if z is None or z <= t or ratio is None or ratio < self.settings.min_ratio:
            return None
        return Trigger(
            f"loss {evidence.records[-1]['loss']:.3f} is {z:.1f} noise sigmas (> {t:g}) above the "
            f"median of the steps before it ({ratio:.2f}x)",
            above(z, t),
        )

    def apply(self, evidence: Evidence, run: RunHandle, orch: OrchestratorState) -> Change:
        run.apply(SkipUpdate())
        return {"update": ["step", "skipped"]}


class Rollback(Intervention):
    """NaN / inf: this step's loss or grad norm is not finite. Action: reload the latest checkpoint
    (model, optimizer, loader, RNG, knobs; the decision history is kept); when the previous
    rollback was at most `repeat_within` steps before, lr_scale x `scale`, else x `first_scale`
    (1: a one-off NaN replays at the same lr; one that comes back replays slower). After
    `max_rollbacks` rollbacks within `repeat_within` steps a NaN raises DivergedError instead: the
    replays do not get past it. Without a checkpoint there is nothing to roll back to and the guard
    does not fire."""

    name = "rollback"
    action = "reload the latest checkpoint, lr_scale x factor"
    guard = True
    recovery = True
    phase = ANY_TIME
    evidence = "this step's loss and grad norm, a checkpoint"

    def check(self, evidence: Evidence, run: RunHandle, orch: OrchestratorState) -> Trigger | None:
        record = evidence.records[-1]
        bad = [k for k in ("loss", "grad_norm") if not math.isfinite(record[k] or 0.0)]
        if not bad or run.latest_checkpoint() is None:
            return None
        return Trigger(f"non-finite {' and '.join(bad)} at step {record['step']}", 1.0)

    def apply(self, evidence: Evidence, run: RunHandle, orch: OrchestratorState) -> Change:
        path = run.latest_checkpoint()
        assert path is not None  # check() found it
        before_step, before_scale = run.step, orch.lr_scale
        step = evidence.records[-1]["step"]
        recent = [
            d
            for d in orch.history
            if d["kind"] == self.name
            and d["applied"]
            and step - d["step"] <= self.settings.repeat_within
        ]
        if len(recent) >= self.settings.max_rollbacks:
            raise DivergedError(
                f"non-finite loss or grad norm at step {step} after {len(recent)} rollbacks "
                f"within orchestrator.rollback.repeat_within = {self.settings.repeat_within} "
                f"steps (orchestrator.rollback.max_rollbacks = {self.settings.max_rollbacks}), "
                f"the last to {path.name} at lr_scale {orch.lr_scale:g}: the run does not get "
                "past it (each rollback is in decisions.jsonl)"
            )
        repeat = bool(recent)
        keep = orch.state_dict()
        run.apply(RollbackTo(path))  # restores the checkpoint's orchestrator state: put ours back
        orch.load_state_dict(keep)  # and decisions.jsonl rewritten to it
        orch.reset_window()
        factor = self.settings.scale if repeat else self.settings.first_scale
        orch.lr_scale = before_scale * factor
        evidence.records[-1]["rolled_back"] = True  # the loop neither evaluates nor saves it
        return {
            "step": [before_step, checkpoint_step(path)],
            "lr_scale": [before_scale, orch.lr_scale],
        }


class OOMRecovery(Intervention):
    """Out of memory inside the step (torch.OutOfMemoryError). Action: halve the micro-batch (to
    the largest divisor of the per-rank batch below it), so accumulation doubles and the global
    batch stays the same, and retry the same batch. At micro-batch 1 the error is re-raised."""

    name = "oom"
    action = "halve the micro-batch, retry the step"
    guard = True
    recovery = True
    phase = ANY_TIME
    evidence = "a torch.OutOfMemoryError in forward / backward, a micro-batch above 1"

    def check(self, evidence: Evidence, run: RunHandle, orch: OrchestratorState) -> Trigger | None:
        micro = run.batch.micro_batch
        if micro <= 1:
            return None
        return Trigger(f"out of memory at micro-batch {micro}", 1.0)

    def apply(self, evidence: Evidence, run: RunHandle, orch: OrchestratorState) -> Change:
        before = run.batch
        after = before.with_micro_batch_halved().micro_batch
        run.apply(SplitMicroBatch(after))
        orch.settings["train.micro_batch_size"] = after
        return {
            "train.micro_batch_size": [before.micro_batch, after],
            "accumulation": [before.accumulation, run.batch.accumulation],
        }
