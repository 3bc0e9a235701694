"""Kinds that act on the optimizer: LR cut, LR re-warm, gradient clipping, weight decay.

The trainer sets every group's lr to schedule(step) x orch.lr_scale each step, so LR kinds change
lr_scale (saved with the orchestrator state) and the next step's param_groups show it.
"""

from __future__ import annotations

from ats_train.orchestrator.base import Change, Evidence, Intervention, Trigger, above


class LRCut(Intervention):
    """Divergence: the mean loss of the window's last third is `threshold` (relative) above the
    best 3-step mean before it, or the val loss rose `threshold` above its best. Action: lr_scale
    x factor (>= limit)."""

    name = "lr_cut"
    action = "lr_scale x factor"

    def check(self, evidence: Evidence, trainer, orch) -> Trigger | None:
        s, t = evidence.signals, self.settings.threshold
        rise = max(s.loss_rise or 0.0, s.val_rel_change or 0.0)
        if rise <= t or orch.lr_scale <= self.settings.limit:
            return None
        return Trigger(f"loss rose {rise:.1%} (> {t:.0%}): diverging", above(rise, t))

    def apply(self, evidence: Evidence, trainer, orch) -> Change:
        before = orch.lr_scale
        orch.lr_scale = max(self.settings.limit, before * self.settings.factor)
        return {"lr_scale": [before, orch.lr_scale]}


class LRRewarm(Intervention):
    """Plateau: the window's second half improved on its first by less than `threshold`
    (relative), outside the planned final quarter of the schedule. Action: lr_scale x factor, so
    that the lr climbs back, never above limit x optim.lr."""

    name = "lr_rewarm"
    action = "lr_scale x factor"

    def check(self, evidence: Evidence, trainer, orch) -> Trigger | None:
        s, t = evidence.signals, self.settings.threshold
        if s.loss_rel_change is None or s.lr is None:
            return None
        if trainer.step > 0.75 * trainer.config.train.steps:
            return None
        if not -t < s.loss_rel_change < t:  # falling (fine) or rising (lr_cut's case)
            return None
        if s.lr * self.settings.factor > self.settings.limit * trainer.config.optim.lr:
            return None
        confidence = min(1.0, 0.5 + 0.5 * (1 - abs(s.loss_rel_change) / t))
        return Trigger(f"loss moved {s.loss_rel_change:+.2%} over the window: plateau", confidence)

    def apply(self, evidence: Evidence, trainer, orch) -> Change:
        before = orch.lr_scale
        orch.lr_scale = before * self.settings.factor
        return {"lr_scale": [before, orch.lr_scale]}


class GradClip(Intervention):
    """Grad-norm spikes: the window's largest grad norm is `threshold` x its median. Action:
    optim.grad_clip x factor (no clipping yet: clip at 2 x the median), never below limit."""

    name = "grad_clip"
    action = "optim.grad_clip x factor"

    def check(self, evidence: Evidence, trainer, orch) -> Trigger | None:
        s, t = evidence.signals, self.settings.threshold
        if s.grad_spike_ratio is None or s.grad_spike_ratio <= t:
            return None
        if trainer.config.optim.grad_clip and trainer.config.optim.grad_clip <= self.settings.limit:
            return None
        return Trigger(
            f"grad norm spiked to {s.grad_spike_ratio:.1f}x its median {s.grad_norm_median:.3g}",
            above(s.grad_spike_ratio, t),
        )

    def apply(self, evidence: Evidence, trainer, orch) -> Change:
        optim = trainer.config.optim
        before = optim.grad_clip
        base = (
            before if before > 0 else 2.0 * evidence.signals.grad_norm_median / self.settings.factor
        )
        optim.grad_clip = max(self.settings.limit, base * self.settings.factor)
        orch.settings["optim.grad_clip"] = optim.grad_clip
        return {"optim.grad_clip": [before, optim.grad_clip]}


class WeightDecay(Intervention):
    """Runaway weight norm: the parameter norm grew `threshold` x over the window. Action: the
    decayed param groups' weight_decay x factor (<= limit); groups without decay stay at 0."""

    name = "weight_decay"
    action = "decayed groups' weight_decay x factor"

    def check(self, evidence: Evidence, trainer, orch) -> Trigger | None:
        s, t = evidence.signals, self.settings.threshold
        if s.param_norm_growth is None or s.param_norm_growth <= t:
            return None
        decays = [
            g["weight_decay"] for g in trainer.optimizer.param_groups if g["weight_decay"] > 0
        ]
        if not decays or min(decays) >= self.settings.limit:
            return None  # nothing decays, or all at the limit: there is nothing to raise
        return Trigger(
            f"parameter norm grew {s.param_norm_growth:.2f}x over the window",
            above(s.param_norm_growth, t),
        )

    def apply(self, evidence: Evidence, trainer, orch) -> Change:
        change = {}
        for i, group in enumerate(trainer.optimizer.param_groups):
            if group["weight_decay"] > 0:
                before = group["weight_decay"]
                group["weight_decay"] = min(self.settings.limit, before * self.settings.factor)
                change[f"param_groups[{i}].weight_decay"] = [before, group["weight_decay"]]
        return change
