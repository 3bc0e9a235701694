"""Kinds that act on the Mixture-of-Depths layers: the capacity curriculum and the collapse guard."""

from __future__ import annotations

import math
import statistics
from typing import TYPE_CHECKING, Any

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
from ats_train.orchestrator.settings import ModCollapseSettings

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


def chance_loss(capacities: list[float]) -> float:
    """aux/mod_predictor of predictors at chance: each layer's top-k target keeps `capacity` of
    the tokens, so the best constant guess scores its binary entropy; summed over the MoD layers
    as the model sums their BCE."""
    return sum(-c * math.log(c) - (1 - c) * math.log(1 - c) for c in capacities if 0 < c < 1)


def predictor_collapse(
    records: list[dict[str, Any]], capacities: list[float], settings: ModCollapseSettings
) -> tuple[str, float] | None:
    """(reason, kept share) when the causal predictors have collapsed, else None.

    Kept share: over the last 3 steps, the lowest layer's mean share of tokens with logit > 0. Under
    the floor (`min_kept_ratio` x capacity) it is a collapse only when the predictor is not at
    chance (its loss, aux/mod_predictor, outside `chance_band` of chance_loss):
    - above the band: confident and wrong (logits far below 0 on the tokens top-k keeps);
    - below it: trained, yet under the floor in each of the last `stuck_steps` records and not
      rising (the mean of their last third <= their first third's).
    An untrained predictor (in the band; e.g. right after warmup it swings from keeping every
    token to none) keeps what the sign of its near-zero logits says and learns out of it."""
    rows = [
        r
        for r in records
        if "mod/predictor_selected" in r and math.isfinite(r["aux/mod_predictor"])
    ]
    if len(rows) < 3:
        return None
    kept_rows = [min(r["mod/predictor_selected"]) for r in rows]
    n_layers = len(rows[-1]["mod/predictor_selected"])
    kept = min(
        statistics.fmean(r["mod/predictor_selected"][i] for r in rows[-3:]) for i in range(n_layers)
    )
    floor = settings.min_kept_ratio * min(capacities)
    if kept >= floor:
        return None
    loss = statistics.fmean(r["aux/mod_predictor"] for r in rows[-3:])
    chance = chance_loss(capacities)
    band = settings.chance_band * chance
    where = f"causal predictor keeps {kept:.1%} of tokens (< {floor:.1%}), loss {loss:.3f}"
    if loss > chance + band:
        return f"{where} > chance {chance:.3f}: confident and wrong", kept
    if loss >= chance - band:
        return None
    stuck = kept_rows[-settings.stuck_steps :]
    third = len(stuck) // 3
    if (
        len(stuck) < settings.stuck_steps
        or max(stuck) >= floor
        or statistics.fmean(stuck[-third:]) > statistics.fmean(stuck[:third])
    ):
        return None
    return f"{where} < chance {chance:.3f}, under the floor for {len(stuck)} steps", kept


class ModCollapse(Intervention):
    """MoD collapse: the causal predictor (what inference routes by) keeps fewer than
    `min_kept_ratio` x capacity of the tokens in some layer and is not merely untrained
    (predictor_collapse), so generation would skip the routed blocks. Action:
    loss.mod_predictor_weight x `scale` (<= `max_weight`), pulling the predictor back to the
    top-k."""

    name = "mod_collapse"
    action = "mod_predictor loss weight x factor"
    evidence = "the causal predictors' kept share and loss over the last 3 (to stuck_steps) steps"

    def check(self, evidence: Evidence, run: RunHandle, orch: OrchestratorState) -> Trigger | None:
        layers = run.model.mod_layers()
        if not layers:
            return None
        capacities = [layer.capacity for layer in layers]
        found = predictor_collapse(evidence.records, capacities, self.settings)
        if found is None:
            return None
        if run.setting("loss.mod_predictor_weight") >= self.settings.max_weight:
            return None
        reason, kept = found
        return Trigger(reason, below(kept, self.settings.min_kept_ratio * min(capacities)))

    def apply(self, evidence: Evidence, run: RunHandle, orch: OrchestratorState) -> Change:
        before = run.setting("loss.mod_predictor_weight")
        after = min(self.settings.max_weight, max(before, 1e-3) * self.settings.scale)
        run.apply(SetLossWeight("mod_predictor_weight", after))
        orch.settings["loss.mod_predictor_weight"] = after
        return {"loss.mod_predictor_weight": [before, after]}
