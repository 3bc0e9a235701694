"""Every intervention kind, by name. One class per kind, grouped by what they act on."""

from __future__ import annotations

from ats_train.orchestrator.base import Intervention
from ats_train.orchestrator.kinds.experts import (
    AuxLossWeights,
    BiasRate,
    CapacityFactor,
    PruneExperts,
    RouterTemperature,
    SplitExpert,
)
from ats_train.orchestrator.kinds.mod import ModCapacity, ModCollapse
from ats_train.orchestrator.kinds.optim import GradClip, LRCut, LRRewarm, WeightDecay
from ats_train.orchestrator.kinds.recovery import OOMRecovery, Rollback, SkipBatch
from ats_train.orchestrator.kinds.run import BatchRamp, EarlyStop, EvalCkptFrequency

KINDS: dict[str, type[Intervention]] = {
    cls.name: cls
    for cls in (
        LRCut,
        LRRewarm,
        GradClip,
        SkipBatch,
        Rollback,
        OOMRecovery,
        PruneExperts,
        SplitExpert,
        CapacityFactor,
        RouterTemperature,
        AuxLossWeights,
        BiasRate,
        ModCapacity,
        ModCollapse,
        WeightDecay,
        BatchRamp,
        EvalCkptFrequency,
        EarlyStop,
    )
}
