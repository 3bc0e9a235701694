"""Kinds that act on the optimizer: LR cut, LR re-warm, gradient clipping, weight decay.

The trainer sets every group's lr to schedule(step) x orch.lr_scale each step, so LR kinds change
lr_scale (saved with the orchestrator state) and the next step's param_groups show it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ats_train.orchestrator.base import (
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
    """Divergence: the mean loss of the window's last third is `rise` (relative) above the
    best 3-step mean before it, or the val loss rose `rise` above its best. Action: lr_scale
    x `scale` (>= `min_lr_scale`)."""

    name = "lr_cut"
    action = "lr_scale x factor"

    def check(self, evidence: Evidence, run: RunHandle, orch: OrchestratorState) -> Trigger | None:
        s, t = evidence.signals, self.settings.rise
        rise = max(s.loss_rise or 0.0, s.val_rel_change or 0.0)
        if rise <= t or orch.lr_scale <= self.settings.min_lr_scale:
            return None
        return Trigger(f"loss rose {rise:.1%} (> {t:.0%}): diverging", above(rise, t))

    def apply(self, evidence: Evidence, run: RunHandle, orch: OrchestratorState) -> Change:
        before = orch.lr_scale
        orch.lr_scale = max(self.settings.min_lr_scale, before * self.settings.scale)
        return {"lr_scale": [before, orch.lr_scale]}


class LRRewarm(Intervention):
    """Plateau: the window's second half improved on its first by less than `plateau`
    (relative), outside the planned final quarter of the schedule. Action: lr_scale x `scale`, so
    that the lr climbs back, never above `max_lr_ratio` x optim.lr."""

    name = "lr_rewarm"
    action = "lr_scale x factor"

    def check(self, evidence: Evidence, run: RunHandle, orch: OrchestratorState) -> Trigger | None:
        s, t = evidence.signals, self.settings.plateau
        if s.loss_rel_change is None or s.lr is None:
            return None
        if run.step > 0.75 * run.setting("train.steps"):
            return None
        if not -t < s.loss_rel_change < t:  # falling (fine) or rising (lr_cut's case)
            return None
        if s.lr * self.settings.scale > self.settings.max_lr_ratio * run.setting("optim.lr"):
            return None
        confidence = min(1.0, 0.5 + 0.5 * (1 - abs(s.loss_rel_change) / t))
        return Trigger(f"loss moved {s.loss_rel_change:+.2%} over the window: plateau", confidence)

    def apply(self, evidence: Evidence, run: RunHandle, orch: OrchestratorState) -> Change:
        before = orch.lr_scale
        orch.lr_scale = before * self.settings.scale
        return {"lr_scale": [before, orch.lr_scale]}


class GradClip(Intervention):
    """Grad-norm spikes: the window's largest grad norm is `spike_ratio` x its median. Action:
    optim.grad_clip x `scale` (no clipping yet: clip at 2 x the median), never below `min_clip`."""

    name = "grad_clip"
    action = "optim.grad_clip x factor"

    def check(self, evidence: Evidence, run: RunHandle, orch: OrchestratorState) -> Trigger | None:
        s, t = evidence.signals, self.settings.spike_ratio
        if s.grad_spike_ratio is None or s.grad_spike_ratio <= t:
            return None
        clip = run.setting("optim.grad_clip")
        if clip and clip <= self.settings.min_clip:
            return None
        return Trigger(
            f"grad norm spiked to {s.grad_spike_ratio:.1f}x its median {s.grad_norm_median:.3g}",
            above(s.grad_spike_ratio, t),
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
