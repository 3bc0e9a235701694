"""Kinds that act on the optimizer: LR cut, LR re-warm, gradient clipping, weight decay.

The trainer sets every group's lr to schedule(step) x orch.lr_scale each step, so LR kinds change
lr_scale (saved with the orchestrator state) and the next step's param_groups show it.
"""

from __future__ import annotations

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
from ats_train.orchestrator.changes import SetGradClip, SetWeightDecay

if TYPE_CHECKING:
    from ats_train.orchestrator.handle import RunHandle


class LRCut(Intervention):
    """Divergence: the mean loss of the window's last third is more than `sigmas` x the run's
    step-to-step loss noise above the best 3-step mean before it, or the val loss rose above its
    best by more than `sigmas` x the relative noise. Action: lr_scale x `scale` (>=
    `min_lr_scale`)."""

    name = "lr_cut"
    action = "lr_scale x factor"
    phase = AFTER_EVALUATIONS
    evidence = "9+ train records after warmup (thirds of 3), their noise; val losses if any"

    def check(self, evidence: Evidence, run: RunHandle, orch: OrchestratorState) -> Trigger | None:
        s, t = evidence.signals, self.settings.sigmas
        if orch.lr_scale <= self.settings.min_lr_scale or not s.loss_noise_rel:
            return None
        rise = s.loss_rise_sigmas or 0.0
        val_rise = (s.val_rel_change or 0.0) / s.loss_noise_rel
        if max(rise, val_rise) <= t:
            return None
        what = "loss" if rise >= val_rise else "val loss"
        return Trigger(
            f"{what} rose {max(rise, val_rise):.1f} noise sigmas (> {t:g}; noise "
            f"{s.loss_noise_rel:.2%} of the loss): diverging",
            above(max(rise, val_rise), t),
        )

    def apply(self, evidence: Evidence, run: RunHandle, orch: OrchestratorState) -> Change:
        before = orch.lr_scale
        orch.lr_scale = max(self.settings.min_lr_scale, before * self.settings.scale)
        return {"lr_scale": [before, orch.lr_scale]}


class LRRewarm(Intervention):
    """Plateau: the window's second half differs from its first by less than `sigmas` standard
    errors (from the run's step-to-step noise), where that standard error is at most half of
    `plateau` (a real improvement of `plateau` per window would have shown), outside the planned
    final quarter of the schedule. Action: lr_scale x `scale`, never above `max_lr_ratio`: with
    the default 1.0 a re-warm gives back what an lr cut took and never lifts the lr above the
    schedule's own (a healthy run's late plateau is the schedule decaying, not a stall)."""

    name = "lr_rewarm"
    action = "lr_scale x factor"
    phase = AFTER_EVALUATIONS
    evidence = "a window of train records after warmup quiet enough to resolve `plateau`"

    def check(self, evidence: Evidence, run: RunHandle, orch: OrchestratorState) -> Trigger | None:
        s = evidence.signals
        change, se = s.loss_rel_change, s.loss_change_se
        if change is None or se is None or s.lr is None:
            return None
        if run.step > 0.75 * run.setting("train.steps"):
            return None
        if se > 0.5 * self.settings.plateau:  # too noisy to tell a plateau from slow progress
            return None
        band = self.settings.sigmas * se
        if not -band < change < band:  # falling (fine) or rising (lr_cut's case)
            return None
        if orch.lr_scale * self.settings.scale > self.settings.max_lr_ratio:
            return None
        confidence = min(1.0, 0.5 + 0.5 * (1 - abs(change) / band))
        return Trigger(
            f"loss moved {change:+.2%} over the window, within {self.settings.sigmas:g} "
            f"standard errors ({se:.2%}): plateau",
            confidence,
        )

    def apply(self, evidence: Evidence, run: RunHandle, orch: OrchestratorState) -> Change:
        before = orch.lr_scale
        orch.lr_scale = before * self.settings.scale
        return {"lr_scale": [before, orch.lr_scale]}


class GradClip(Intervention):
    """Gradient explosion: some step's log grad norm jumped above the median of the 5 before it by
    more than `sigmas` x the window's step-to-step spread of the log grad norm, while the clip is
    off or looser than `bounded_ratio` x the median grad norm (a tighter clip already bounds the
    spike's update; halving it again would clip every step). Action: optim.grad_clip x `scale`
    (no clipping yet: clip at 2 x the median), never below `min_clip`."""

    name = "grad_clip"
    action = "optim.grad_clip x factor"
    recovery = True
    phase = ANY_TIME
    evidence = "grad norms of orchestrator.min_records steps, their noise"

    def check(self, evidence: Evidence, run: RunHandle, orch: OrchestratorState) -> Trigger | None:
        s, t = evidence.signals, self.settings.sigmas
        if s.grad_spike_sigmas is None or s.grad_spike_sigmas <= t:
            return None
        if s.grad_spike_ratio is None or s.grad_spike_ratio < self.settings.min_ratio:
            return None
        clip = run.setting("optim.grad_clip")
        if clip and clip <= self.settings.min_clip:
            return None
        if clip and clip <= self.settings.bounded_ratio * s.grad_norm_median:
            return None
        return Trigger(
            f"grad norm jumped {s.grad_spike_sigmas:.1f} noise sigmas (> {t:g}), to "
            f"{s.grad_spike_ratio:.1f}x its median {s.grad_norm_median:.3g}",
            above(s.grad_spike_sigmas, t),
        )

    def apply(self, evidence: Evidence, run: RunHandle, orch: OrchestratorState) -> Change:
        before = run.setting("optim.grad_clip")
        base = (
            before if before > 0 else 2.0 * evidence.signals.grad_norm_median / self.settings.scale
        )
        after = max(self.settings.min_clip, base * self.settings.scale)
        run.apply(SetGradClip(after))
        orch.settings["optim.grad_clip"] = after
        return {"optim.grad_clip": [before, after]}


class WeightDecay(Intervention):
    """Runaway weight norm: the parameter norm grew `norm_growth` x over the window. Action: the
    decayed param groups' weight_decay x `scale` (<= `max_decay`); groups without decay stay at 0.
    """

    name = "weight_decay"
    action = "decayed groups' weight_decay x factor"
    phase = AFTER_EVALUATIONS
    evidence = "parameter norms over a window after warmup"

    def check(self, evidence: Evidence, run: RunHandle, orch: OrchestratorState) -> Trigger | None:
        s, t = evidence.signals, self.settings.norm_growth
        if s.param_norm_growth is None or s.param_norm_growth <= t:
            return None
        decays = [decay for decay in run.weight_decays() if decay > 0]
        if not decays or min(decays) >= self.settings.max_decay:
            return None  # nothing decays, or all at the limit: there is nothing to raise
        return Trigger(
            f"parameter norm grew {s.param_norm_growth:.2f}x over the window",
            above(s.param_norm_growth, t),
        )

    def apply(self, evidence: Evidence, run: RunHandle, orch: OrchestratorState) -> Change:
        change = {}
        for i, before in enumerate(run.weight_decays()):
            if before > 0:
                after = min(self.settings.max_decay, before * self.settings.scale)
                run.apply(SetWeightDecay(i, after))
                change[f"param_groups[{i}].weight_decay"] = [before, after]
        return change
