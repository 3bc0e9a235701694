"""Kinds that act on the MoE layers: prune, split, capacity factor, router temperature, aux / z
loss weights and the aux-loss-free bias-balancing rate. Utilization is each expert's share of
routed slots x n_experts, averaged over the evidence window (1 = its fair share)."""

from __future__ import annotations

import statistics

from ats_model import flops_per_token

from ats_train.orchestrator.base import Change, Evidence, Intervention, Trigger, above, below
from ats_train.orchestrator.expert_surgery import prune_experts, split_experts


def utilization(evidence: Evidence) -> list[list[float]]:
    """(n_moe_layers, E) window-mean share x E, from records of the current expert count."""
    rows = [r["moe/expert_fraction"] for r in evidence.records if "moe/expert_fraction" in r]
    n_experts = len(rows[-1][0])
    rows = [row for row in rows if len(row[0]) == n_experts]
    return [
        [statistics.fmean(row[i][e] for row in rows) * n_experts for e in range(n_experts)]
        for i in range(len(rows[-1]))
    ]


def _structure_changed(trainer, orch) -> None:
    """After prune / split: the backend clips the new tensors, the window restarts (its records
    have the old expert count), and the count is re-applied on resume."""
    trainer.backend.wrap(trainer.model, trainer.optimizer)
    config = trainer.raw_model.config
    orch.settings["model.moe.n_experts"] = config.moe.n_experts
    trainer.flops_per_token = flops_per_token(config, trainer.config.train.seq_len)  # router E x C
    orch.flops_per_token = trainer.flops_per_token
    orch.reset_window()


class PruneExperts(Intervention):
    """An expert under a utilization floor: some expert's utilization < threshold. Action: every
    MoE layer drops its `limit` (default 1) least-used experts, keeping more than top_k."""

    name = "prune_experts"
    action = "drop the least-used expert of every MoE layer"

    def check(self, evidence: Evidence, trainer, orch) -> Trigger | None:
        s, t = evidence.signals, self.settings.threshold
        if s.expert_util_min is None or s.expert_util_min >= t:
            return None
        layers = trainer.raw_model.moe_layers()
        if layers[0].n_experts - int(self.settings.limit) <= max(x.top_k for x in layers):
            return None
        return Trigger(
            f"an expert gets {s.expert_util_min:.3f}x its fair share (< {t})",
            below(s.expert_util_min, t),
        )

    def apply(self, evidence: Evidence, trainer, orch) -> Change:
        util = utilization(evidence)
        n_drop = int(self.settings.limit)
        keep = [sorted(sorted(range(len(u)), key=lambda e: u[e])[n_drop:]) for u in util]
        before = trainer.raw_model.config.moe.n_experts
        prune_experts(trainer.raw_model, trainer.optimizer, keep)
        _structure_changed(trainer, orch)
        dropped = [sorted(set(range(before)) - set(k)) for k in keep]
        return {"n_experts": [before, before - n_drop], "dropped": [None, dropped]}


class SplitExpert(Intervention):
    """An overloaded expert: some expert's utilization > threshold. Action: every MoE layer
    splits its most-used expert in two (weights, router row and optimizer state copied, the copy
    perturbed by 1% of the init std), up to `limit` experts."""

    name = "split_expert"
    action = "split the most-used expert of every MoE layer"

    def check(self, evidence: Evidence, trainer, orch) -> Trigger | None:
        s, t = evidence.signals, self.settings.threshold
        if s.expert_util_max is None or s.expert_util_max <= t:
            return None
        if trainer.raw_model.config.moe.n_experts + 1 > self.settings.limit:
            return None
        return Trigger(
            f"an expert gets {s.expert_util_max:.2f}x its fair share (> {t})",
            above(s.expert_util_max, t),
        )

    def apply(self, evidence: Evidence, trainer, orch) -> Change:
        util = utilization(evidence)
        hot = [max(range(len(u)), key=lambda e: u[e]) for u in util]
        before = trainer.raw_model.config.moe.n_experts
        noise = 0.01 * trainer.raw_model.config.init_std
        split_experts(trainer.raw_model, trainer.optimizer, hot, noise)
        _structure_changed(trainer, orch)
        return {"n_experts": [before, before + 1], "split": [None, hot]}


def _set_moe(trainer, orch, attr: str, value) -> Change:
    layers = trainer.raw_model.moe_layers()
    before = [getattr(layer, attr) for layer in layers]
    for layer in layers:
        setattr(layer, attr, value)
    return {f"moe.{attr}": [before, [value] * len(layers)]}


class CapacityFactor(Intervention):
    """Token dropping: a layer drops more than `threshold` of its routed slots. Action: every
    MoE layer's capacity_factor x factor (<= limit). Dropless layers (None) never drop."""

    name = "capacity_factor"
    action = "capacity_factor x factor"

    def check(self, evidence: Evidence, trainer, orch) -> Trigger | None:
        s, t = evidence.signals, self.settings.threshold
        cf = trainer.raw_model.moe_layers()[0].capacity_factor if s.dropped_fraction else None
        if cf is None or s.dropped_fraction <= t or cf >= self.settings.limit:
            return None
        return Trigger(
            f"{s.dropped_fraction:.1%} of routed slots dropped", above(s.dropped_fraction, t)
        )

    def apply(self, evidence: Evidence, trainer, orch) -> Change:
        cf = trainer.raw_model.moe_layers()[0].capacity_factor
        return _set_moe(
            trainer, orch, "capacity_factor", min(self.settings.limit, cf * self.settings.factor)
        )


class RouterTemperature(Intervention):
    """Routing collapse to near one-hot: router entropy / ln(E) < threshold. Action: every MoE
    layer's temperature x factor (<= limit), softening the router's probabilities."""

    name = "router_temperature"
    action = "router temperature x factor"

    def check(self, evidence: Evidence, trainer, orch) -> Trigger | None:
        s, t = evidence.signals, self.settings.threshold
        temperature = (
            trainer.raw_model.moe_layers()[0].temperature if s.routing_entropy is not None else None
        )
        if temperature is None or s.routing_entropy >= t or temperature >= self.settings.limit:
            return None
        return Trigger(
            f"router entropy {s.routing_entropy:.2f} of its maximum", below(s.routing_entropy, t)
        )

    def apply(self, evidence: Evidence, trainer, orch) -> Change:
        temperature = trainer.raw_model.moe_layers()[0].temperature
        return _set_moe(
            trainer,
            orch,
            "temperature",
            min(self.settings.limit, temperature * self.settings.factor),
        )


class AuxLossWeights(Intervention):
    """Load imbalance: the most-used expert's utilization - 1 > threshold -> loss.moe_lb_weight
    x factor (<= limit); router logits blowing up: router z > target (default 50) ->
    loss.moe_z_weight x factor (<= limit)."""

    name = "aux_loss_weights"
    action = "moe_lb / moe_z loss weight x factor"

    def _z_limit(self) -> float:
        return 50.0 if self.settings.target is None else self.settings.target

    def check(self, evidence: Evidence, trainer, orch) -> Trigger | None:
        s, t = evidence.signals, self.settings.threshold
        loss = trainer.config.loss
        reasons, confidence = [], 0.0
        if s.imbalance is not None and s.imbalance > t and loss.moe_lb_weight < self.settings.limit:
            reasons.append(f"imbalance {s.imbalance:.2f} > {t}")
            confidence = max(confidence, above(s.imbalance, t))
        z = self._z_limit()
        if s.router_z is not None and s.router_z > z and loss.moe_z_weight < self.settings.limit:
            reasons.append(f"router z {s.router_z:.3g} > {z:g}")
            confidence = max(confidence, above(s.router_z, z))
        return Trigger("; ".join(reasons), confidence) if reasons else None

    def apply(self, evidence: Evidence, trainer, orch) -> Change:
        s, loss, change = evidence.signals, trainer.config.loss, {}
        for attr, fired in (
            ("moe_lb_weight", s.imbalance is not None and s.imbalance > self.settings.threshold),
            ("moe_z_weight", s.router_z is not None and s.router_z > self._z_limit()),
        ):
            if fired:
                before = getattr(loss, attr)
                after = min(self.settings.limit, max(before, 1e-4) * self.settings.factor)
                setattr(loss, attr, after)
                orch.settings[f"loss.{attr}"] = after
                change[f"loss.{attr}"] = [before, after]
        return change


class BiasRate(Intervention):
    """Load imbalance (as aux_loss_weights) -> the aux-loss-free bias-balancing rate (DeepSeek-V3)
    of every MoE layer: off -> target (default 1e-3), on -> x factor, <= limit. Not with
    activation checkpointing (the bias update in forward would run twice)."""

    name = "bias_rate"
    action = "raise the bias-balancing rate"

    def check(self, evidence: Evidence, trainer, orch) -> Trigger | None:
        s, t = evidence.signals, self.settings.threshold
        if s.imbalance is None or s.imbalance <= t or trainer.config.train.activation_checkpointing:
            return None
        if trainer.raw_model.moe_layers()[0].bias_update_rate >= self.settings.limit:
            return None
        return Trigger(f"imbalance {s.imbalance:.2f} > {t}", above(s.imbalance, t))

    def apply(self, evidence: Evidence, trainer, orch) -> Change:
        rate = trainer.raw_model.moe_layers()[0].bias_update_rate
        start = 1e-3 if self.settings.target is None else self.settings.target
        after = start if rate == 0 else min(self.settings.limit, rate * self.settings.factor)
        return _set_moe(trainer, orch, "bias_update_rate", after)
