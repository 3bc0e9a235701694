"""TrainConfig: the whole config of a run, one section per area, and the checks across sections."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ats_train.config.choices import KernelsName, check_choices, require
from ats_train.config.parallel import ParallelSection
from ats_train.config.sections import (
    CheckpointSection,
    DataSection,
    LossSection,
    ModelSection,
    OptimSection,
    ProfileSection,
    TrainSection,
)
from ats_train.faults.settings import FaultsSection
from ats_train.orchestrator.settings import OrchestratorSection
from ats_train.planning.settings import PlanSection


@dataclass
class TrainConfig:
    model: ModelSection = field(default_factory=ModelSection)
    data: DataSection = field(default_factory=DataSection)
    train: TrainSection = field(default_factory=TrainSection)
    loss: LossSection = field(default_factory=LossSection)
    optim: OptimSection = field(default_factory=OptimSection)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    parallel: ParallelSection = field(default_factory=ParallelSection)
    orchestrator: OrchestratorSection = field(default_factory=OrchestratorSection)
    faults: FaultsSection = field(default_factory=FaultsSection)
    plan: PlanSection = field(default_factory=PlanSection)
    profile: ProfileSection = field(default_factory=ProfileSection)
    kernels: KernelsName = "auto"  # ats_kernels.select(): chosen once when the model is built

    def __post_init__(self) -> None:
        check_choices(self, "")
        if self.train.overlap_host:
            self._check_overlap_host()
        require(
            self.checkpoint.format == "full" or self.parallel.backend != "colossalai",
            "checkpoint.format = 'sharded' is not implemented for parallel.backend = "
            "'colossalai'; use checkpoint.format = 'full'",
        )

    def _check_overlap_host(self) -> None:
        """train.overlap_host reads a step's numbers after the next step is queued: refuse what
        must act on them before that (rescale, drill a fault) or reads them in a collective. The
        orchestrator judges each step one step late (its changes land a step later)."""
        faults = [f.name for f in dataclasses.fields(self.faults) if f.name.endswith("_at_step")]
        drills = [name for name in faults if getattr(self.faults, name) is not None]
        problems = [
            (self.parallel.backend == "single", f"parallel.backend = {self.parallel.backend!r}"),
            (self.train.precision != "fp16", "train.precision = 'fp16' (its loss scaler)"),
            (not drills, f"faults.{drills[0] if drills else ''} set"),
        ]
        for ok, what in problems:
            require(
                ok,
                f"train.overlap_host = true cannot run with {what}: needs parallel.backend = "
                "'single', no fp16 and no faults.*, which act on a "
                "step's numbers before the next step starts",
            )
