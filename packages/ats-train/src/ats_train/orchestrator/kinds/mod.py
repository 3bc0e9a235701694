"""Kinds that act on the Mixture-of-Depths layers: the capacity curriculum and the collapse guard."""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING

from ats_train.orchestrator.base import (
    AFTER_EVALUATIONS,
    Change,
    Evidence,
    Intervention,
    OrchestratorState,
    Trigger,
    below,
)
from ats_train.orchestrator.changes import SetLossWeight, SetModCapacity

if TYPE_CHECKING:
    from ats_train.orchestrator.handle import RunHandle


class ModCapacity(Intervention):
    """Capacity curriculum / annealing (off while `target_capacity` is None): start at the model's
    capacity and, each time the loss is not rising (window change < `stable_change`), move every MoD
    layer's capacity x `scale` towards `target_capacity` (e.g. start dense at 1.0, anneal to 0.125).
    """

    name = "mod_capacity"
    action = "MoD capacity one step towards target"
    phase = AFTER_EVALUATIONS
    evidence = "a window of train records after warmup"

    def check(self, evidence: Evidence, run: RunHandle, orch: OrchestratorState) -> Trigger | None:
        target, s = self.settings.target_capacity, evidence.signals
        layers = run.model.mod_layers()
        if target is None or not layers or abs(layers[0].capacity - target) < 1e-9:
            return None
        if s.loss_rel_change is None or s.loss_rel_change >= self.settings.stable_change:
            return None
        return Trigger(
            f"loss stable ({s.loss_rel_change:+.2%}): capacity {layers[0].capacity:.3f} -> "
            f"target {target:.3f}",
            1.0,
        )

    def apply(self, evidence: Evidence, run: RunHandle, orch: OrchestratorState) -> Change:
        layers = run.model.mod_layers()
        before, target, factor = (
            layers[0].capacity,
            self.settings.target_capacity,
            self.settings.scale,
        )
        if target < before:
            after = max(target, before * factor)
        else:
            after = min(target, before / factor)
        run.apply(SetModCapacity(after))
        return {"mod.capacity": [before, after]}


class ModCollapse(Intervention):
    """MoD collapse: over the last 3 steps the causal predictor (what inference routes by) kept
    fewer than `min_kept_ratio` x capacity of the tokens in some layer, so generation would skip the
    routed blocks. Action: loss.mod_predictor_weight x `scale` (<= `max_weight`), pulling the
    predictor back to the top-k."""

    name = "mod_collapse"
    action = "mod_predictor loss weight x factor"
    evidence = "the causal predictors' kept share over the last 3 steps"

    def check(self, evidence: Evidence, run: RunHandle, orch: OrchestratorState) -> Trigger | None:
        layers = run.model.mod_layers()
        rows = [
            r["mod/predictor_selected"]
            for r in evidence.records[-3:]
            if "mod/predictor_selected" in r
        ]
        if not rows or not layers:
            return None
        kept = min(statistics.fmean(row[i] for row in rows) for i in range(len(rows[0])))
        floor = self.settings.min_kept_ratio * min(layer.capacity for layer in layers)
        if kept >= floor:
            return None
        if run.setting("loss.mod_predictor_weight") >= self.settings.max_weight:
            return None
        return Trigger(
            f"causal predictor keeps {kept:.1%} of tokens (< {floor:.1%})",
            below(kept, floor),
        )

    def apply(self, evidence: Evidence, run: RunHandle, orch: OrchestratorState) -> Change:
        before = run.setting("loss.mod_predictor_weight")
        after = min(self.settings.max_weight, max(before, 1e-3) * self.settings.scale)
        run.apply(SetLossWeight("mod_predictor_weight", after))
        orch.settings["loss.mod_predictor_weight"] = after
        return {"loss.mod_predictor_weight": [before, after]}
