"""Kinds that act on the Mixture-of-Depths layers: the capacity curriculum and the collapse guard."""

from __future__ import annotations

import statistics

from ats_train.orchestrator.base import Change, Evidence, Intervention, Trigger, below


class ModCapacity(Intervention):
    """Capacity curriculum / annealing (off while `target` is None): start at the model's
    capacity and, each time the loss is not rising (window change < threshold), move every MoD
    layer's capacity x factor towards `target` (e.g. start dense at 1.0, anneal to 0.125)."""

    name = "mod_capacity"
    action = "MoD capacity one step towards target"

    def check(self, evidence: Evidence, trainer, orch) -> Trigger | None:
        target, s = self.settings.target, evidence.signals
        layers = trainer.raw_model.mod_layers()
        if target is None or not layers or abs(layers[0].capacity - target) < 1e-9:
            return None
        if s.loss_rel_change is None or s.loss_rel_change >= self.settings.threshold:
            return None
        return Trigger(
            f"loss stable ({s.loss_rel_change:+.2%}): capacity {layers[0].capacity:.3f} -> "
            f"target {target:.3f}",
            1.0,
        )

    def apply(self, evidence: Evidence, trainer, orch) -> Change:
        layers = trainer.raw_model.mod_layers()
        before, target, factor = layers[0].capacity, self.settings.target, self.settings.factor
        if target < before:
            after = max(target, before * factor)
        else:
            after = min(target, before / factor)
        for layer in layers:
            layer.capacity = after
        return {"mod.capacity": [before, after]}


class ModCollapse(Intervention):
    """MoD collapse: over the last 3 steps the causal predictor (what inference routes by) kept
    fewer than threshold x capacity of the tokens in some layer, so generation would skip the
    routed blocks. Action:
    loss.mod_predictor_weight x factor (<= limit), pulling the predictor back to the top-k."""

    name = "mod_collapse"
    action = "mod_predictor loss weight x factor"

    def check(self, evidence: Evidence, trainer, orch) -> Trigger | None:
        layers = trainer.raw_model.mod_layers()
        rows = [
            r["mod/predictor_selected"]
            for r in evidence.records[-3:]
            if "mod/predictor_selected" in r
        ]
        if not rows or not layers:
            return None
        kept = min(statistics.fmean(row[i] for row in rows) for i in range(len(rows[0])))
        floor = self.settings.threshold * min(layer.capacity for layer in layers)
        if kept >= floor:
            return None
        if trainer.config.loss.mod_predictor_weight >= self.settings.limit:
            return None
        return Trigger(
            f"causal predictor keeps {kept:.1%} of tokens (< {floor:.1%})",
            below(kept, floor),
        )

    def apply(self, evidence: Evidence, trainer, orch) -> Change:
        loss = trainer.config.loss
        before = loss.mod_predictor_weight
        loss.mod_predictor_weight = min(
            self.settings.limit, max(before, 1e-3) * self.settings.factor
        )
        orch.settings["loss.mod_predictor_weight"] = loss.mod_predictor_weight
        return {"loss.mod_predictor_weight": [before, loss.mod_predictor_weight]}
