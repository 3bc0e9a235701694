"""Kinds that act on the MoE layers: prune, split, capacity factor, router temperature, aux / z
loss weights and the aux-loss-free bias-balancing rate. Utilization is each expert's share of
routed slots x n_experts, averaged over the evidence window (1 = its fair share)."""

from __future__ import annotations

import math
import statistics
from typing import TYPE_CHECKING, Any

import numpy as np

from ats_train.orchestrator.base import (
    Change,
    Evidence,
    Intervention,
    OrchestratorState,
    Trigger,
    above,
    below,
)
from ats_train.orchestrator.changes import PruneExperts as PruneTo
from ats_train.orchestrator.changes import SetLossWeight, SetMoE, SplitExperts
from ats_train.orchestrator.settings import KindSettings

Slot = tuple[int, int]  # (MoE layer, expert)

if TYPE_CHECKING:
    from ats_train.orchestrator.handle import RunHandle


def utilization(evidence: Evidence) -> list[list[float]]:
    """(n_moe_layers, E) window-mean share x E, from records of the current expert count."""
    rows = [r["moe/expert_fraction"] for r in evidence.records if "moe/expert_fraction" in r]
    n_experts = len(rows[-1][0])
    rows = [row for row in rows if len(row[0]) == n_experts]
    return [
        [statistics.fmean(row[i][e] for row in rows) * n_experts for e in range(n_experts)]
        for i in range(len(rows[-1]))
    ]


def _structure_changed(run: RunHandle, orch: OrchestratorState) -> None:
    """After prune / split (the run re-wraps the new tensors and recounts its FLOPs per token, the
    router's E x C): the window restarts (its records have the old expert count), and the count
    is re-applied on resume."""
    orch.settings["model.moe.n_experts"] = run.model.config.moe.n_experts
    orch.flops_per_token = run.flops_per_token
    orch.reset_window()


def beyond(records: list[dict[str, Any]], limit: float, sigmas: float, low: bool) -> set[Slot]:
    """(layer, expert) whose window-mean utilization is beyond `limit` (under it when `low`) by
    `sigmas` standard errors of that mean, from its own step-to-step spread over the records of
    the current expert count: one window of a small batch is not evidence of a lasting imbalance."""
    rows = [r["moe/expert_fraction"] for r in records if "moe/expert_fraction" in r]
    n_experts = len(rows[-1][0])
    util = np.asarray([row for row in rows if len(row[0]) == n_experts]) * n_experts  # (n, L, E)
    if len(util) < 2:
        return set()
    mean, se = util.mean(axis=0), util.std(axis=0, ddof=1) / math.sqrt(len(util))  # (L, E)
    margin = (limit - mean) if low else (mean - limit)
    return {(int(i), int(e)) for i, e in zip(*np.nonzero(margin > sigmas * se), strict=True)}


class Streak:
    """Evaluations in a row at which the same (layer, expert) was beyond a kind's limit. An
    evaluation continues the streak when the one before it saw part of the same records (no change
    restarted the window in between). Saved with the orchestrator state, so a resume counts on."""

    def __init__(self) -> None:
        self.step, self.count, self.slots = -1, 0, set()

    def update(self, records: list[dict[str, Any]], slots: set[Slot]) -> int:
        continued = self.count > 0 and self.step >= records[0]["step"]
        kept = self.slots & slots if continued else set()
        if kept:
            self.count, self.slots = self.count + 1, kept
        else:  # a new streak of the experts beyond now, if any
            self.count, self.slots = (1 if slots else 0), slots
        self.step = records[-1]["step"]
        return self.count

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "count": self.count, "slots": sorted(map(list, self.slots))}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step, self.count = int(state["step"]), int(state["count"])
        self.slots = {(int(i), int(e)) for i, e in state["slots"]}


class StreakIntervention(Intervention):
    """A kind that acts on the same expert beyond its limit at several evaluations in a row: the
    streak is saved with the orchestrator state, so a resumed run acts at the same step."""

    def __init__(self, settings: KindSettings) -> None:
        super().__init__(settings)
        self.streak = Streak()

    def state_dict(self) -> dict[str, Any]:
        return {"streak": self.streak.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.streak.load_state_dict(state["streak"])


class PruneExperts(StreakIntervention):
    """A lasting dead expert: the same expert's utilization under `min_utilization` (by `sigmas`
    standard errors) at `evaluations` evaluations in a row. Action: every MoE layer drops its
    `experts_dropped` least-used experts, keeping more than top_k."""

    name = "prune_experts"
    action = "drop the least-used expert of every MoE layer"
    evidence = "per-step expert utilization over `evaluations` evaluations in a row"

    def check(self, evidence: Evidence, run: RunHandle, orch: OrchestratorState) -> Trigger | None:
        s, t = evidence.signals, self.settings.min_utilization
        if s.expert_util_min is None:
            return None
        slots = beyond(evidence.records, t, self.settings.sigmas, low=True)
        if self.streak.update(evidence.records, slots) < self.settings.evaluations:
            return None
        layers = run.model.moe_layers()
        if layers[0].n_experts - self.settings.experts_dropped <= max(x.top_k for x in layers):
            return None
        return Trigger(
            f"an expert gets {s.expert_util_min:.3f}x its fair share (< {t}) at "
            f"{self.streak.count} evaluations in a row",
            below(s.expert_util_min, t),
        )

    def apply(self, evidence: Evidence, run: RunHandle, orch: OrchestratorState) -> Change:
        util = utilization(evidence)
        n_drop = self.settings.experts_dropped
        keep = [sorted(sorted(range(len(u)), key=lambda e: u[e])[n_drop:]) for u in util]
        before = run.model.config.moe.n_experts
        run.apply(PruneTo(tuple(tuple(k) for k in keep)))
        _structure_changed(run, orch)
        dropped = [sorted(set(range(before)) - set(k)) for k in keep]
        return {"n_experts": [before, before - n_drop], "dropped": [None, dropped]}


class SplitExpert(StreakIntervention):
    """A lasting overloaded expert: the same expert's utilization over `max_utilization` (by
    `sigmas` standard errors) at `evaluations` evaluations in a row. Action: every MoE layer splits
    its most-used expert in two (weights, router row and optimizer state copied, the copy perturbed
    by 1% of the init std), up to `max_experts` experts."""

    name = "split_expert"
    action = "split the most-used expert of every MoE layer"
    evidence = "per-step expert utilization over `evaluations` evaluations in a row"

    def check(self, evidence: Evidence, run: RunHandle, orch: OrchestratorState) -> Trigger | None:
        s, t = evidence.signals, self.settings.max_utilization
        if s.expert_util_max is None:
            return None
        slots = beyond(evidence.records, t, self.settings.sigmas, low=False)
        if self.streak.update(evidence.records, slots) < self.settings.evaluations:
            return None
        if run.model.config.moe.n_experts + 1 > self.settings.max_experts:
            return None
        return Trigger(
            f"an expert gets {s.expert_util_max:.2f}x its fair share (> {t}) at "
            f"{self.streak.count} evaluations in a row",
            above(s.expert_util_max, t),
        )

    def apply(self, evidence: Evidence, run: RunHandle, orch: OrchestratorState) -> Change:
        util = utilization(evidence)
        hot = [max(range(len(u)), key=lambda e: u[e]) for u in util]
        before = run.model.config.moe.n_experts
        noise = 0.01 * run.model.config.init_std
        run.apply(SplitExperts(tuple(hot), noise))
        _structure_changed(run, orch)
        return {"n_experts": [before, before + 1], "split": [None, hot]}


def _set_moe(run: RunHandle, attr: str, value: float) -> Change:
    layers = run.model.moe_layers()
    before = [getattr(layer, attr) for layer in layers]
    run.apply(SetMoE(attr, value))
    return {f"moe.{attr}": [before, [value] * len(layers)]}


class CapacityFactor(Intervention):
    """Token dropping: a layer drops more than `max_dropped` of its routed slots. Action: every MoE
    layer's capacity_factor x `scale` (<= `max_capacity_factor`). Dropless layers (None) never drop.
    """

    name = "capacity_factor"
    action = "capacity_factor x factor"

    def check(self, evidence: Evidence, run: RunHandle, orch: OrchestratorState) -> Trigger | None:
        s, t = evidence.signals, self.settings.max_dropped
        cf = run.model.moe_layers()[0].capacity_factor if s.dropped_fraction else None
        if cf is None or s.dropped_fraction <= t or cf >= self.settings.max_capacity_factor:
            return None
        return Trigger(
            f"{s.dropped_fraction:.1%} of routed slots dropped", above(s.dropped_fraction, t)
        )

    def apply(self, evidence: Evidence, run: RunHandle, orch: OrchestratorState) -> Change:
        cf = run.model.moe_layers()[0].capacity_factor
        return _set_moe(
            run, "capacity_factor", min(self.settings.max_capacity_factor, cf * self.settings.scale)
        )


class RouterTemperature(Intervention):
    """Routing collapse to near one-hot: router entropy / ln(E) < `min_entropy`. Action: every MoE
    layer's temperature x `scale` (<= `max_temperature`), softening the router's probabilities."""

    name = "router_temperature"
    action = "router temperature x factor"

    def check(self, evidence: Evidence, run: RunHandle, orch: OrchestratorState) -> Trigger | None:
        s, t = evidence.signals, self.settings.min_entropy
        temperature = (
            run.model.moe_layers()[0].temperature if s.routing_entropy is not None else None
        )
        if (
            temperature is None
            or s.routing_entropy >= t
            or temperature >= self.settings.max_temperature
        ):
            return None
        return Trigger(
            f"router entropy {s.routing_entropy:.2f} of its maximum", below(s.routing_entropy, t)
        )

    def apply(self, evidence: Evidence, run: RunHandle, orch: OrchestratorState) -> Change:
        temperature = run.model.moe_layers()[0].temperature
        return _set_moe(
            run,
            "temperature",
            min(self.settings.max_temperature, temperature * self.settings.scale),
        )


class AuxLossWeights(Intervention):
    """Load imbalance: the most-used expert's utilization - 1 > `max_imbalance` ->
    loss.moe_lb_weight x `scale` (<= `max_weight`); router logits blowing up: router z >
    `max_router_z` -> loss.moe_z_weight x `scale` (<= `max_weight`)."""

    name = "aux_loss_weights"
    action = "moe_lb / moe_z loss weight x factor"

    def check(self, evidence: Evidence, run: RunHandle, orch: OrchestratorState) -> Trigger | None:
        s, t = evidence.signals, self.settings.max_imbalance
        lb, z_weight = run.setting("loss.moe_lb_weight"), run.setting("loss.moe_z_weight")
        reasons, confidence = [], 0.0
        if s.imbalance is not None and s.imbalance > t and lb < self.settings.max_weight:
            reasons.append(f"imbalance {s.imbalance:.2f} > {t}")
            confidence = max(confidence, above(s.imbalance, t))
        z = self.settings.max_router_z
        if s.router_z is not None and s.router_z > z and z_weight < self.settings.max_weight:
            reasons.append(f"router z {s.router_z:.3g} > {z:g}")
            confidence = max(confidence, above(s.router_z, z))
        return Trigger("; ".join(reasons), confidence) if reasons else None

    def apply(self, evidence: Evidence, run: RunHandle, orch: OrchestratorState) -> Change:
        s, change = evidence.signals, {}
        for attr, fired in (
            (
                "moe_lb_weight",
                s.imbalance is not None and s.imbalance > self.settings.max_imbalance,
            ),
            ("moe_z_weight", s.router_z is not None and s.router_z > self.settings.max_router_z),
        ):
            if fired:
                before = run.setting(f"loss.{attr}")
                after = min(self.settings.max_weight, max(before, 1e-4) * self.settings.scale)
                run.apply(SetLossWeight(attr, after))
                orch.settings[f"loss.{attr}"] = after
                change[f"loss.{attr}"] = [before, after]
        return change


class BiasRate(Intervention):
    """Load imbalance (as aux_loss_weights) -> the aux-loss-free bias-balancing rate (DeepSeek-V3)
    of every MoE layer: off -> `start_rate`, on -> x `scale`, <= `max_rate`. Not with
    activation checkpointing (the bias update in forward would run twice)."""

    name = "bias_rate"
    action = "raise the bias-balancing rate"

    def check(self, evidence: Evidence, run: RunHandle, orch: OrchestratorState) -> Trigger | None:
        s, t = evidence.signals, self.settings.max_imbalance
        if s.imbalance is None or s.imbalance <= t or run.setting("train.activation_checkpointing"):
            return None
        if run.model.moe_layers()[0].bias_update_rate >= self.settings.max_rate:
            return None
        return Trigger(f"imbalance {s.imbalance:.2f} > {t}", above(s.imbalance, t))

    def apply(self, evidence: Evidence, run: RunHandle, orch: OrchestratorState) -> Change:
        rate = run.model.moe_layers()[0].bias_update_rate
        start = self.settings.start_rate
        after = start if rate == 0 else min(self.settings.max_rate, rate * self.settings.scale)
        return _set_moe(run, "bias_update_rate", after)
